"""The scheduler's input: the fleet, the queues and the jobs at one instant.

A snapshot is plain data. ``now`` is part of it: the core never reads a clock. Resource
amounts are integer milli-units (see :mod:`allotment.domain.resources`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from allotment.domain.cluster import Cluster, Node
from allotment.domain.job import JobSpec
from allotment.domain.resources import GPU


@dataclass(slots=True, kw_only=True)
class SchedulerPolicy:
    """How a cycle behaves; trace replay names and composes these (``fifo-isolated``...).

    The switches say which strategy of each concern a cycle uses; only
    :func:`allotment.scheduler.policy.compose` reads them. The numbers bound a cycle's
    work or tune a strategy (``aging_horizon``, ``max_reservations``, ``reserve_after``).
    """

    name: str = "default"
    borrowing: bool = True
    """Queues may use idle quota of others within borrowing and lending limits."""
    preemption: bool = True
    """Higher priority may preempt lower priority within a queue (queue policy permitting)."""
    reclaim: bool = True
    """A queue within its nominal quota may take lent capacity back by preemption."""
    fair_share: bool = True
    """Order equal priorities across queues by weighted dominant-resource share."""
    backfill: bool = True
    """Jobs behind a blocked one may start if they do not delay its reservation."""
    strict_fifo: bool = False
    """Without backfill: a blocked head blocks the rest of its queue (Slurm/Helios FIFO)."""
    aging_horizon: float = 4 * 3600.0
    """Seconds of waiting worth one whole unit of fair share (no starvation); 0 = off."""
    max_reservations: int = 8
    """How many blocked jobs get a backfill reservation per cycle."""
    reserve_after: float = 4 * 3600.0
    """With ``reclaim`` on: how long a job waits before it may hold a backfill
    reservation. A job within its guarantee takes it back by preemption; holding
    capacity idle for it is the last resort of one that starves. Without ``reclaim``
    (classic EASY backfill) the first blocked jobs reserve at once."""
    backfill_depth: int = 16
    """How many jobs per queue are looked at past a blocked one in one cycle (not
    counting those short of quota, nor gangs short of capacity)."""
    max_examined_past_block: int = 2000
    """How many jobs that do not start one cycle looks at, across all queues; the rest
    keep waiting behind them until the next cycle (bounds a cycle on a full fleet)."""
    preemption_searches: int = 32
    """How many victim searches one cycle may run (the rest wait for the next cycle)."""
    oracle: bool = False
    """Replay only: the scheduler is shown true durations as expected runtimes."""
    protect_covered: bool = False
    """Reclaim never takes the jobs that a borrowing queue's guarantee covers: its
    earliest submitted running jobs, in submission order, while together they stay
    within its nominal quota (:func:`~allotment.scheduler.victims.covered`)."""


def by_fields(value: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``__reduce__`` of the core's frozen value types: rebuilt from their fields by
    keyword. (Compiled with mypyc, a frozen class cannot be unpickled field by field, as
    pickle does by default; the what-if's worker processes receive and return them.)"""
    return _rebuilt, (type(value), {f.name: getattr(value, f.name) for f in fields(value)})


def _rebuilt(cls: Callable[..., Any], values: dict[str, Any]) -> Any:
    return cls(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaRequest:
    """One replica group of a job: ``count`` replicas of ``resources`` (milli-units)."""

    name: str = "worker"
    count: int = 1
    resources: Mapping[str, int] = field(default_factory=dict)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return by_fields(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaPlacement:
    """Where one replica runs: its node, what it holds there and its GPU device indexes.

    A fractional GPU request (under 1000 milli-GPU) holds a share of one device.
    """

    group: str
    index: int
    node: str
    resources: Mapping[str, int]
    devices: tuple[int, ...] = ()

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return by_fields(self)


@dataclass(slots=True, kw_only=True)
class PendingJob:
    """A job waiting for admission, as the scheduler sees it (never its true duration)."""

    id: str
    queue: str
    priority_class: str
    submit_time: float
    replicas: tuple[ReplicaRequest, ...]
    pools: tuple[str, ...] = ()
    """Acceptable pools in preference order; empty means every pool the queue may use."""
    max_runtime: float | None = None
    expected_runtime: float | None = None
    not_before: float | None = None
    """Back-off: not before this time (seconds since the epoch)."""
    preemptible: bool = False
    """A victim even where its class is not preemptible (the spec's ``preemptible``)."""
    preempting: tuple[str, ...] = ()
    """Victims already preempted for this job and not yet gone."""
    moved: bool = False
    """Back in line after a move (a victim of cause ``move``, evicted only because it
    fits again at once elsewhere in its pool): nominated like a preemptor, it is tried
    before anyone else in the next cycle, so that the room it was promised is not taken
    by a job ahead of it."""

    @property
    def replica_count(self) -> int:
        """How many replicas in all (computed once: a cycle asks it of every job it
        passes)."""
        if self._count < 0:
            self._count = sum(r.count for r in self.replicas)
        return self._count

    @property
    def runtime_bound(self) -> float | None:
        """How long it runs at most, as far as is known: its ``max_runtime``, else its
        expected runtime (what reservations ahead of it are checked against)."""
        return self.max_runtime if self.max_runtime is not None else self.expected_runtime

    @property
    def nominated(self) -> bool:
        """Tried before anyone else: it preempted victims, or it was moved."""
        return bool(self.preempting) or self.moved

    _total: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    _shape: str | None = field(default=None, init=False, repr=False, compare=False)
    _asks: str | None = field(default=None, init=False, repr=False, compare=False)
    _count: int = field(default=-1, init=False, repr=False, compare=False)

    def shape(self) -> str:
        """The request (replica counts and resources) as a key for caches: a string, so
        that its hash is computed once (a cycle looks up keys holding it for most jobs
        it passes)."""
        if self._shape is None:
            self._shape = repr(
                tuple((g.count, tuple(sorted(g.resources.items()))) for g in self.replicas)
            )
        return self._shape

    def asks(self) -> str:
        """What decides a try's answer within a cycle (computed once): jobs asking the
        same -- queue, class, shape, pools, runtime bound -- fail the same way, as the
        world only fills up during a cycle. A string, so that its hash is computed once
        (a cycle looks it up for every job it passes)."""
        if self._asks is None:
            self._asks = repr(
                (self.queue, self.priority_class, self.shape(), self.pools, self.runtime_bound)
            )
        return self._asks

    def total(self) -> dict[str, int]:
        """All replicas together, milli-units (computed once; do not change the result)."""
        if self._total is None:
            out: dict[str, int] = {}
            for group in self.replicas:
                for key, amount in group.resources.items():
                    out[key] = out.get(key, 0) + amount * group.count
            self._total = out
        return self._total

    @property
    def gpus(self) -> int:
        """Total milli-GPUs."""
        return sum(r.resources.get(GPU, 0) * r.count for r in self.replicas)


@dataclass(slots=True, kw_only=True)
class RunningJob:
    """A job that holds an allocation (admitted, starting or running)."""

    id: str
    queue: str
    priority_class: str
    pool: str
    start_time: float
    placements: tuple[ReplicaPlacement, ...]
    expected_end: float | None = None
    """When it is expected to end (expected runtime), if known."""
    max_end: float | None = None
    """When its max_runtime runs out, if it has one."""
    terminating: bool = False
    """Preempted or cancelled; its resources are still held until it is gone."""
    preemptible: bool = False
    """A victim even where its class is not preemptible (the spec's ``preemptible``)."""
    submit_time: float | None = None
    """When it was submitted (its place in its queue's line; None: its start time)."""

    def total(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for placement in self.placements:
            for key, amount in placement.resources.items():
                out[key] = out.get(key, 0) + amount
        return out

    @property
    def end_bound(self) -> float | None:
        """Best known end: expected, else the max_runtime limit, else unknown."""
        return self.expected_end if self.expected_end is not None else self.max_end


@dataclass(slots=True, kw_only=True)
class Snapshot:
    """Everything one cycle needs. ``nodes`` defaults to the cluster's declared nodes."""

    now: float
    cluster: Cluster
    pending: Sequence[PendingJob] = ()
    running: Sequence[RunningJob] = ()
    nodes: Sequence[Node] | None = None
    policy: SchedulerPolicy = field(default_factory=SchedulerPolicy)

    def node_list(self) -> Sequence[Node]:
        return list(self.cluster.nodes.values()) if self.nodes is None else self.nodes


def pending_from_spec(
    job_id: str,
    spec: JobSpec,
    cluster: Cluster,
    *,
    submit_time: float,
    not_before: float | None = None,
) -> PendingJob:
    """What the scheduler sees of a submitted job file: its replicas, acceptable pools,
    priority class (the queue's default when the job names none) and declared runtimes.
    An unknown queue or class is passed through; the cycle answers it with ``invalid``."""
    queue = cluster.queues.get(spec.queue)
    klass = cluster.priority_class_for(queue, spec.priority_class) if queue else None
    return PendingJob(
        id=job_id,
        queue=spec.queue,
        priority_class=klass.name if klass else (spec.priority_class or ""),
        submit_time=submit_time,
        replicas=tuple(
            ReplicaRequest(name=g.name, count=g.count, resources=g.resources.as_dict())
            for g in spec.replicas
        ),
        pools=tuple(spec.pools),
        max_runtime=spec.max_runtime,
        expected_runtime=spec.expected_runtime,
        not_before=not_before,
        preemptible=spec.preemptible,
    )
