"""What a replay produces: every job's story, every attempt, and what was measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from allotment.scheduler.snapshot import SchedulerPolicy

SUCCEEDED = "succeeded"
FAILED = "failed"
PREEMPTED = "preempted"
CANCELLED = "cancelled"
RECLAIMED = "reclaimed"
UNFINISHED = "unfinished"


@dataclass(slots=True, kw_only=True)
class Attempt:
    """One attempt of one job: a row of ``--jobs-out``. Times are replay seconds;
    ``gpus`` is the attempt's total in milli-GPUs, ``nodes`` its milli-GPUs per node."""

    job_id: str
    queue: str
    attempt: int
    submit: float
    start: float | None
    end: float | None
    gpus: int
    nodes: tuple[tuple[str, int], ...]
    outcome: str
    borrowed: int = 0
    """Milli-GPUs of it borrowed beyond its queue's nominal quota."""


@dataclass(slots=True, kw_only=True)
class JobResult:
    """A job's whole story: first start, final end and final outcome."""

    job_id: str
    queue: str
    submit: float
    duration: float
    gpus: int
    first_start: float | None = None
    end: float | None = None
    outcome: str = UNFINISHED
    attempts: int = 0
    preempted: int = 0
    gpu_seconds: float = 0.0
    """Milli-GPU-seconds held over all attempts."""
    lost_gpu_seconds: float = 0.0
    """Of those, the milli-GPU-seconds of attempts that ended preempted: work thrown
    away, as a preempted job starts again from scratch."""
    sampled: bool = False
    """A forecast of its start was made when it was submitted (``predict_every``)."""
    predicted_start: float | None = None
    """That forecast (None: none could be made)."""


@dataclass(slots=True, kw_only=True)
class ReplayResult:
    """Everything a replay produced, for metrics and ``--jobs-out``."""

    policy: SchedulerPolicy
    jobs: list[JobResult]
    attempts: list[Attempt]
    total_gpus: int
    """Milli-GPUs of the healthy nodes."""
    cycles: int = 0
    instants_cut: int = 0
    """Instants the replay left before their cycles settled (its guard against a
    livelock, ``max_cycles_per_instant``, was reached): 0 in a faithful replay."""
    preemptions: int = 0
    scheduler_s: float = 0.0
    forecast_s: float = 0.0
    """Seconds spent forecasting start times (``predict_every``), within ``wall_s``."""
    wall_s: float = 0.0
    node_pools: dict[str, str] = field(default_factory=dict)
    """The pool of every healthy node."""
    waiting_s: float = 0.0
    """Replay seconds during which some job waited."""
    held_while_waiting: float = 0.0
    """Milli-GPU-seconds held during those seconds."""
    unusable_while_waiting: float = 0.0
    """Milli-GPU-seconds free during those seconds on nodes where none of the waiting
    jobs' replicas (the first 16 of each queue) fits: fragmentation, sampled about
    2,000 times over the replay."""
    nominal_gpus: dict[str, int] = field(default_factory=dict)
    """Each leaf queue's nominal GPUs (milli), summed over pools (for owed waits)."""
    shortfalls: list[Shortfall] | None = None
    """Every time a queue was owed its guarantee and did not get it (None: not tracked,
    the scheduler was a snapshot function)."""


@dataclass(frozen=True, slots=True)
class Shortfall:
    """From ``start`` to ``end``, ``queue``'s first waiting job fitted in its unused
    guaranteed quota of a pool where other queues held part of that guarantee, and the
    cycles at ``start`` did not give it back (see :meth:`Session.short_of_guarantee`)."""

    queue: str
    start: float
    end: float
