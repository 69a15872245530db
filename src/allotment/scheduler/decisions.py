"""The scheduler's output: one decision per job it looked at, each with its reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allotment.domain.reasons import Reason
from allotment.scheduler.snapshot import PendingJob, ReplicaPlacement, RunningJob, by_fields


@dataclass(frozen=True, slots=True, kw_only=True)
class Admit:
    """Start ``job`` in ``pool`` with these placements. ``borrowed`` is the part of its
    request (milli-units per resource) above its queue's unused nominal quota, lent by
    ``lenders`` (the queues whose subtree covers it, nearest first)."""

    job: str
    queue: str
    pool: str
    placements: tuple[ReplicaPlacement, ...]
    borrowed: dict[str, int] = field(default_factory=dict)
    lenders: tuple[str, ...] = ()
    backfilled: bool = False

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return by_fields(self)

    def running(self, job: PendingJob, *, at: float) -> RunningJob:
        """The running job this admission of ``job`` becomes when it starts at ``at``:
        expected end from its expected runtime, maximum end from its max_runtime."""
        return RunningJob(
            id=job.id,
            queue=job.queue,
            priority_class=job.priority_class,
            pool=self.pool,
            start_time=at,
            placements=self.placements,
            expected_end=None if job.expected_runtime is None else at + job.expected_runtime,
            max_end=None if job.max_runtime is None else at + job.max_runtime,
            preemptible=job.preemptible,
            submit_time=job.submit_time,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Victim:
    """A running job to preempt, and why, in words the victim's owner can read."""

    job: str
    queue: str
    cause: str
    """``within_queue``, ``reclaim``, ``borrow_only`` or ``move``."""
    message: str

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return by_fields(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Preempt:
    """Preempt ``victims`` so that ``job`` fits in ``pool``; ``job`` waits with
    ``waiting_for_preemption`` until they are gone, and their resources stay reserved."""

    job: str
    queue: str
    pool: str
    victims: tuple[Victim, ...]
    reason: Reason

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return by_fields(self)


class WaitingReasons(Mapping[str, Reason]):
    """The reason of every waiting job: reasons set one by one, plus whole runs of jobs
    that share one (a queue's tail behind a blocked job), expanded only when read.

    A cycle on a large backlog leaves most jobs where they were; writing each of them a
    reason would cost more than the decisions that matter.
    """

    __slots__ = ("_expanded", "_explicit", "_runs")

    def __init__(self) -> None:
        self._explicit: dict[str, Reason] = {}
        self._runs: list[tuple[Sequence[str], Reason]] = []
        self._expanded: dict[str, Reason] | None = None

    def __setitem__(self, job: str, reason: Reason) -> None:
        self._explicit[job] = reason
        if self._expanded is not None:
            self._expanded[job] = reason

    def add_run(self, jobs: Sequence[str], reason: Reason) -> None:
        """Give every job in ``jobs`` the same reason, unless one is set for it."""
        if jobs:
            self._runs.append((jobs, reason))
            self._expanded = None

    def _all(self) -> dict[str, Reason]:
        if self._expanded is None:
            merged: dict[str, Reason] = {}
            for jobs, reason in self._runs:
                merged.update(dict.fromkeys(jobs, reason))
            merged.update(self._explicit)
            self._expanded = merged
        return self._expanded

    def __getitem__(self, job: str) -> Reason:
        found = self._explicit.get(job)
        return found if found is not None else self._all()[job]

    def __contains__(self, job: object) -> bool:
        return job in self._explicit or job in self._all()

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"WaitingReasons({self._all()!r})"


@dataclass(slots=True, kw_only=True)
class Decisions:
    """The result of one cycle.

    ``waiting`` holds a reason for *every* pending job that was not admitted, including
    those the cycle did not look at (``behind_higher_priority``). ``reservations`` maps a
    blocked job to the time its backfill reservation starts.
    """

    now: float
    admitted: list[Admit] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    waiting: WaitingReasons = field(default_factory=WaitingReasons)
    reservations: dict[str, float] = field(default_factory=dict)
    queue_order: dict[str, list[str]] = field(default_factory=dict)
    """Each queue's pending jobs (ids) in the order the cycle considers them."""
    next_wakeup: float | None = None
    """The earliest later time at which a job held back by time alone (a closed time
    window, a retry back-off) becomes eligible: run a cycle then even if nothing else
    happens."""
    stats: dict[str, Any] = field(default_factory=dict)

    def position(self, job_id: str, queue: str) -> int | None:
        """The job's 1-based place in its queue's order (a linear search: for one job)."""
        order = self.queue_order.get(queue, [])
        try:
            return order.index(job_id) + 1
        except ValueError:
            return None

    def admitted_ids(self) -> set[str]:
        return {a.job for a in self.admitted}
