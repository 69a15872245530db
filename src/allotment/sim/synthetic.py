"""Synthetic gang-heavy workloads for scheduling-quality evaluation (``allot synth``).

A workload is a trace in the generic CSV format of :mod:`allotment.sim.trace` and the
``cluster.yaml`` it runs on. It is a pure function of :class:`GangHeavy` (the seed
included): the same parameters give the same files, byte for byte.

The model:

- **Fleet.** ``nodes`` nodes of ``gpus_per_node`` GPUs (8 by default) in one pool
  ``gpu``, GPUs only (the trace asks for nothing else).
- **Queues.** ``queues`` leaf queues ``team-a``, ``team-b``, ... under one root ``org``.
  Their nominal GPU quotas sum to the fleet and are unequal: weights ``Q, Q-1, ..., 1``
  (4 queues: 40 %, 30 %, 20 %, 10 %), each at least 1 GPU, rounded to whole GPUs by
  largest remainder. A queue offers GPU-time in proportion to its quota.
- **Offered load.** ``sum(gpus x replicas x duration) / (fleet GPUs x span)`` where the
  span is ``days`` of arrivals. The arrival rate is solved from the target: each queue
  draws jobs until their GPU-time reaches its share of ``load x fleet GPUs x span``,
  and the job that would overshoot is shortened to meet it (dropped if that leaves it
  under a minute), so the realised load misses the target by less than a minute of one
  job per queue and kind (gangs, small jobs).
- **Gangs.** ``gang_share`` of the GPU-time is in gangs of 2 to 8 whole nodes
  (``replicas`` 2..8 of ``gpus_per_node`` GPUs each), each size drawn with weight
  ``1/size`` (so every size carries about the same GPU-time). A queue's gangs are at
  most as large as its quota holds whole nodes, so every job fits its own queue's
  guarantee and no policy has to leave a job waiting forever; the gang GPU-time goes
  to the queues whose quota holds a 2-node gang, in proportion to their quotas.
- **Small jobs.** The rest: 1 GPU (70 % of them), 2 GPUs (20 %) or 4 GPUs (10 %), never
  more than the node or the queue's quota holds.
- **Durations.** Log-normal, heavy-tailed: gangs a median of 90 min (sigma 1.0), small
  jobs 20 min (sigma 1.5); at least a minute, capped at 24 h (or the span, if shorter).
- **Arrivals.** A non-homogeneous Poisson process per queue, conditioned on its number
  of jobs: each job's submit time is drawn independently from the queue's intensity
  ``1 + burst x cos(2 pi (t / period - q / Q))`` over ``[0, span)``. The phases are
  spread evenly, so queue ``q`` peaks ``q / Q`` of a period (a day) after queue 0: the
  queues burst at different times, a bursting queue borrows the idle quota of the quiet
  ones until they reclaim it. The expected total swings far less than any one queue: it
  is level only when the quotas are equal, and swings by about a quarter with the
  default four queues, against ``burst`` (80 %) for each.
- **Declared limits.** ``limit_share`` of the jobs declare a ``max_runtime`` of their
  duration times a factor drawn uniformly from 1 to 3, rounded up to whole 5 minutes:
  never shorter than the job, so no job is stopped at its limit.

Job ids are ``j000001``, ... in submit order; every job uses its queue's default
priority class and any pool.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from allotment.domain.errors import InvalidInput

DAY_S = 86_400.0
POOL = "gpu"
ROOT = "org"
MIN_DURATION_S = 60
"""No job is shorter than a minute."""
MAX_DURATION_S = 24 * 3600
"""No job is longer than a day (or the span, if shorter)."""
GANG_MEDIAN_S = 1.5 * 3600.0
GANG_SIGMA = 1.0
SMALL_MEDIAN_S = 20 * 60.0
SMALL_SIGMA = 1.5
MIN_GANG_NODES = 2
MAX_GANG_NODES = 8
SMALL_GPUS: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.2), (4, 0.1))
"""Small jobs' GPUs and how often each is drawn."""
LIMIT_ROUND_S = 300
LIMIT_FACTOR = (1.0, 3.0)
MAX_JOBS = 1_000_000
MAX_QUEUES = 26
MAX_NODES = 10_000
MAX_DAYS = 366.0
MAX_LOAD = 2.0
MAX_GPUS_PER_NODE = 64
Shape = tuple[int, int, int]
"""A job before it has a time: GPUs per replica, replicas, duration in seconds."""
TRACE_COLUMNS = ("job_id", "submit_time", "duration", "queue", "gpus", "replicas", "max_runtime")
"""The generic trace columns the synthetic trace writes, in the reader's order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GangHeavy:
    """The parameters of a gang-heavy workload; :meth:`check` says what is wrong."""

    load: float = 0.9
    """Target offered load (0.80-0.95 is the usual range; above 1 overloads)."""
    seed: int = 1
    nodes: int = 32
    gpus_per_node: int = 8
    queues: int = 4
    days: float = 3.0
    """Span of arrivals, in days."""
    gang_share: float = 0.6
    """Fraction of the GPU-time in gangs of 2-8 nodes."""
    burst: float = 0.8
    """Amplitude of each queue's arrival cycle: 0 level, 1 silent at its trough."""
    period_days: float = 1.0
    """Length of that cycle."""
    limit_share: float = 0.5
    """Fraction of the jobs that declare a ``max_runtime``."""

    @property
    def fleet_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def span_s(self) -> float:
        return self.days * DAY_S

    def check(self) -> None:
        """Raise :class:`InvalidInput` naming the first parameter out of range (as the
        CLI option that sets it)."""
        _between("--load", self.load, 0.0, MAX_LOAD, low_open=True)
        _whole("--nodes", self.nodes, 2, MAX_NODES)
        _whole("--gpus-per-node", self.gpus_per_node, 1, MAX_GPUS_PER_NODE)
        _whole("--queues", self.queues, 1, MAX_QUEUES)
        if self.queues > self.fleet_gpus:
            raise InvalidInput(
                f"--queues {self.queues} is more than the fleet's {self.fleet_gpus} GPUs: "
                "every queue is guaranteed at least one GPU"
            )
        _between("--days", self.days, 0.0, MAX_DAYS, low_open=True)
        _between("--gang-share", self.gang_share, 0.0, 1.0)
        _between("--burst", self.burst, 0.0, 1.0)
        _between("period_days", self.period_days, 0.0, MAX_DAYS, low_open=True)
        _between("--limit-share", self.limit_share, 0.0, 1.0)


def _between(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> None:
    ok = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not ok:
        bound = f"more than {low:g}" if low_open else f"at least {low:g}"
        raise InvalidInput(
            f"{name} must be {bound} and at most {high:g}, got {value:g}",
            fields={"name": name, "value": value},
        )


def _whole(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidInput(
            f"{name} must be a whole number from {low} to {high:,}, got {value}",
            fields={"name": name, "value": value},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SynthJob:
    """One job of a synthetic trace; ``gpus`` per replica, whole GPUs; times in seconds."""

    job_id: str
    submit_time: int
    duration: int
    queue: str
    gpus: int
    replicas: int = 1
    max_runtime: int | None = None

    @property
    def gang(self) -> bool:
        return self.replicas > 1

    @property
    def gpu_seconds(self) -> int:
        return self.gpus * self.replicas * self.duration


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePlan:
    """A leaf queue: its nominal GPUs, its largest gang (0: none) and its GPU-time
    budgets, in GPU-seconds."""

    name: str
    quota_gpus: int
    max_gang_nodes: int
    gang_budget: float
    small_budget: float
    phase: float
    """Where in the arrival cycle it peaks, as a fraction of the period."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A generated workload: the parameters, the queues and the jobs in submit order."""

    spec: GangHeavy
    queues: tuple[QueuePlan, ...]
    jobs: tuple[SynthJob, ...] = field(repr=False)

    @property
    def gpu_seconds(self) -> int:
        return sum(job.gpu_seconds for job in self.jobs)

    @property
    def offered_load(self) -> float:
        """``sum(gpus x replicas x duration) / (fleet GPUs x span)``."""
        return self.gpu_seconds / (self.spec.fleet_gpus * self.spec.span_s)

    @property
    def realised_gang_share(self) -> float:
        """The fraction of the GPU-time in gangs (0 for an empty workload)."""
        total = self.gpu_seconds
        gangs = sum(job.gpu_seconds for job in self.jobs if job.gang)
        return gangs / total if total else 0.0


def quotas(total: int, count: int) -> list[int]:
    """``total`` GPUs split over ``count`` queues with weights ``count, ..., 1``: one GPU
    each, the rest by largest remainder (ties to the earlier queue)."""
    if count < 1 or total < count:
        raise ValueError(f"cannot split {total} GPUs over {count} queues")
    weights = list(range(count, 0, -1))
    rest = total - count
    exact = [rest * w / sum(weights) for w in weights]
    shares = [math.floor(x) for x in exact]
    by_remainder = sorted(range(count), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[: rest - sum(shares)]:
        shares[i] += 1
    return [1 + s for s in shares]


def queue_name(index: int) -> str:
    """``team-a``, ``team-b``, ... (at most :data:`MAX_QUEUES`)."""
    return f"team-{chr(ord('a') + index)}"


def plan_queues(spec: GangHeavy) -> tuple[QueuePlan, ...]:
    """The leaf queues with their quotas and GPU-time budgets.

    Raises :class:`InvalidInput` when the gang share cannot be met: no queue's quota
    holds a 2-node gang, or those that do offer less GPU-time than the gangs need."""
    spec.check()
    fleet = spec.fleet_gpus
    work = spec.load * fleet * spec.span_s
    gpus = quotas(fleet, spec.queues)
    largest = [min(MAX_GANG_NODES, spec.nodes, g // spec.gpus_per_node) for g in gpus]
    largest = [n if n >= MIN_GANG_NODES else 0 for n in largest]
    capable = sum(g for g, n in zip(gpus, largest, strict=True) if n) / fleet
    if spec.gang_share > 0 and capable == 0:
        raise InvalidInput(
            f"no queue's quota holds a gang of {MIN_GANG_NODES} nodes "
            f"({MIN_GANG_NODES * spec.gpus_per_node} GPUs): give more --nodes or fewer "
            "--queues, or --gang-share 0"
        )
    if spec.gang_share > capable + 1e-12:
        raise InvalidInput(
            f"--gang-share {spec.gang_share:g} is more than the {capable:.0%} of the GPU-time "
            f"offered by the queues whose quota holds a gang of {MIN_GANG_NODES} nodes: "
            "give a smaller --gang-share, more --nodes or fewer --queues"
        )
    plans = []
    for i, (quota, most) in enumerate(zip(gpus, largest, strict=True)):
        share = quota / fleet
        gang = work * spec.gang_share * share / capable if most else 0.0
        plans.append(
            QueuePlan(
                name=queue_name(i),
                quota_gpus=quota,
                max_gang_nodes=most,
                gang_budget=gang,
                small_budget=max(0.0, work * share - gang),
                phase=i / spec.queues,
            )
        )
    return tuple(plans)


class _Draw:
    """The random choices, all from one ``random.Random(seed)``, in a fixed order."""

    def __init__(self, spec: GangHeavy) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.cap = max(MIN_DURATION_S, min(MAX_DURATION_S, math.floor(spec.span_s)))
        self.count = 0

    def duration(self, median: float, sigma: float) -> int:
        drawn = self.rng.lognormvariate(math.log(median), sigma)
        return max(MIN_DURATION_S, min(self.cap, round(drawn)))

    def gang_nodes(self, most: int) -> int:
        sizes = range(MIN_GANG_NODES, most + 1)
        return self.rng.choices(sizes, weights=[1 / n for n in sizes])[0]

    def small_gpus(self, quota: int) -> int:
        most = min(quota, self.spec.gpus_per_node)
        allowed = [(g, w) for g, w in SMALL_GPUS if g <= most]
        return self.rng.choices([g for g, _ in allowed], weights=[w for _, w in allowed])[0]

    def stream(self, budget: float, shape: Callable[[], Shape]) -> list[Shape]:
        """Jobs ``(gpus per replica, replicas, duration)`` from ``shape()`` until their
        GPU-time meets ``budget``; the last one is shortened to meet it exactly (and
        left out if that makes it shorter than a minute)."""
        jobs: list[Shape] = []
        held = 0.0
        while held < budget:
            gpus, replicas, duration = shape()
            size = gpus * replicas
            if held + size * duration >= budget:
                duration = round((budget - held) / size)
                if duration < MIN_DURATION_S:
                    break
            jobs.append((gpus, replicas, duration))
            held += size * duration
            self.count += 1
            if self.count > MAX_JOBS:
                raise InvalidInput(
                    f"this workload would have more than {MAX_JOBS:,} jobs: give fewer "
                    "--nodes or --days"
                )
        return jobs

    def submit_time(self, phase: float) -> int:
        """A time in ``[0, span)`` from the intensity ``1 + burst cos(2 pi (t/P - phase))``,
        by rejection."""
        spec = self.spec
        period = spec.period_days * DAY_S
        top = 1.0 + spec.burst
        while True:
            t = self.rng.uniform(0.0, spec.span_s)
            level = 1.0 + spec.burst * math.cos(2 * math.pi * (t / period - phase))
            if self.rng.random() * top < level:
                return min(math.floor(t), math.ceil(spec.span_s) - 1)

    def max_runtime(self, duration: int) -> int | None:
        if self.rng.random() >= self.spec.limit_share:
            return None
        limit = duration * self.rng.uniform(*LIMIT_FACTOR)
        return max(LIMIT_ROUND_S, math.ceil(limit / LIMIT_ROUND_S) * LIMIT_ROUND_S)


def gang_heavy(spec: GangHeavy | None = None) -> Workload:
    """Generate the workload ``spec`` describes (default parameters if None).

    Raises :class:`InvalidInput` for parameters out of range or a gang share the queues
    cannot carry (see :func:`plan_queues`)."""
    spec = spec or GangHeavy()
    plans = plan_queues(spec)
    draw = _Draw(spec)
    node = spec.gpus_per_node
    # (submit, queue index, sequence in queue, gpus, replicas, duration, max_runtime)
    drafted: list[tuple[int, int, int, int, int, int, int | None]] = []
    for index, plan in enumerate(plans):

        def gang(plan: QueuePlan = plan) -> Shape:
            nodes = draw.gang_nodes(plan.max_gang_nodes)
            return node, nodes, draw.duration(GANG_MEDIAN_S, GANG_SIGMA)

        def small(plan: QueuePlan = plan) -> Shape:
            gpus = draw.small_gpus(plan.quota_gpus)
            return gpus, 1, draw.duration(SMALL_MEDIAN_S, SMALL_SIGMA)

        shapes = draw.stream(plan.gang_budget, gang) if plan.max_gang_nodes else []
        shapes += draw.stream(plan.small_budget, small)
        for seq, (gpus, replicas, duration) in enumerate(shapes):
            submit = draw.submit_time(plan.phase)
            limit = draw.max_runtime(duration)
            drafted.append((submit, index, seq, gpus, replicas, duration, limit))
    if not drafted:
        raise InvalidInput(
            "these parameters give no job of a minute or more: raise --load, --days or --nodes"
        )
    drafted.sort()
    width = max(6, len(str(len(drafted))))
    jobs = tuple(
        SynthJob(
            job_id=f"j{n:0{width}d}",
            submit_time=submit,
            duration=duration,
            queue=plans[index].name,
            gpus=gpus,
            replicas=replicas,
            max_runtime=limit,
        )
        for n, (submit, index, _, gpus, replicas, duration, limit) in enumerate(drafted, 1)
    )
    return Workload(spec=spec, queues=plans, jobs=jobs)


# -- the files ------------------------------------------------------------------------


def trace_csv(workload: Workload) -> str:
    """The jobs as a generic trace CSV (:data:`TRACE_COLUMNS`; ``max_runtime`` empty
    where none is declared)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TRACE_COLUMNS)
    for job in workload.jobs:
        writer.writerow(
            (
                job.job_id,
                job.submit_time,
                job.duration,
                job.queue,
                job.gpus,
                job.replicas,
                "" if job.max_runtime is None else job.max_runtime,
            )
        )
    return out.getvalue()


def cluster_data(workload: Workload) -> dict[str, Any]:
    """The cluster as ``cluster.yaml`` would hold it: one pool, the nodes, the root
    ``org`` guaranteed the fleet and the leaf queues their quotas."""
    spec = workload.spec
    return {
        "pools": [{"name": POOL}],
        "nodes": [
            {
                "name_prefix": "node-",
                "count": spec.nodes,
                "pool": POOL,
                "capacity": {"gpu": spec.gpus_per_node},
            }
        ],
        "queues": [
            {
                "name": ROOT,
                "quota": {POOL: {"gpu": spec.fleet_gpus}},
                "children": [
                    {"name": q.name, "quota": {POOL: {"gpu": q.quota_gpus}}}
                    for q in workload.queues
                ],
            }
        ],
    }


def describe(spec: GangHeavy) -> str:
    """The parameters as the ``allot synth gang-heavy`` options that give them."""
    return (
        f"--load {spec.load:g} --seed {spec.seed} --nodes {spec.nodes} "
        f"--gpus-per-node {spec.gpus_per_node} --queues {spec.queues} --days {spec.days:g} "
        f"--gang-share {spec.gang_share:g} --burst {spec.burst:g} "
        f"--limit-share {spec.limit_share:g}"
    )


def cluster_yaml(workload: Workload) -> str:
    """``cluster.yaml`` for the workload, with a comment saying how it was made."""
    spec = workload.spec
    quotas_text = ", ".join(f"{q.name} {q.quota_gpus}" for q in workload.queues)
    head = (
        "# A synthetic gang-heavy cluster, written by:\n"
        f"#   allot synth gang-heavy {describe(spec)}\n"
        f"# {spec.nodes} nodes x {spec.gpus_per_node} GPUs = {spec.fleet_gpus} GPUs in one "
        f"pool; nominal GPUs: {quotas_text}.\n"
    )
    body = yaml.safe_dump(cluster_data(workload), sort_keys=False, default_flow_style=None)
    return head + body


def summary(workload: Workload) -> dict[str, Any]:
    """What was generated, for people and ``-o json``."""
    spec = workload.spec
    jobs = workload.jobs
    gangs = [j for j in jobs if j.gang]
    per_queue = {
        q.name: {
            "quota_gpus": q.quota_gpus,
            "max_gang_nodes": q.max_gang_nodes,
            "jobs": sum(1 for j in jobs if j.queue == q.name),
            "gangs": sum(1 for j in gangs if j.queue == q.name),
        }
        for q in workload.queues
    }
    return {
        "seed": spec.seed,
        "nodes": spec.nodes,
        "gpus_per_node": spec.gpus_per_node,
        "fleet_gpus": spec.fleet_gpus,
        "days": spec.days,
        "target_load": spec.load,
        "offered_load": round(workload.offered_load, 4),
        "target_gang_share": spec.gang_share,
        "gang_share": round(workload.realised_gang_share, 4),
        "jobs": len(jobs),
        "gang_jobs": len(gangs),
        "small_jobs": len(jobs) - len(gangs),
        "with_max_runtime": sum(1 for j in jobs if j.max_runtime is not None),
        "gpu_hours": round(workload.gpu_seconds / 3600, 1),
        "queues": per_queue,
    }
