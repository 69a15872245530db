"""The usage figures of one attempt in a window, and their sums per group.

Every figure of an attempt is computed with exact rational arithmetic from its held
time, its amounts and its (correctly rounded, ``math.fsum``) sample sums, and rounded
once, half to even, to an integer number of *micro-units* (10⁻⁶ GPU-hour, core-hour,
GiB-hour or unit of cost). A group's figures are integer sums of its attempts'
figures, so a total is exactly the sum of the records it covers, whatever the grouping
or the order.

For an attempt holding ``g`` GPUs over ``[start, end)`` (``end``: when its last replica
was gone, or the window's end while it is open), clipped to the window ``[since,
until)``, with ``s`` the clipped seconds:

- ``allocated`` = g·s/3600 GPU-hours;
- ``measured`` = g·m/3600, where ``m`` is the clipped time covered by utilisation
  samples (``job_usage`` rows with a GPU utilisation; overlapping rows count once);
- ``used`` = g·Σ(len·util/100)/3600 over those rows;
- ``idle`` = measured - used; ``unmeasured`` = allocated - measured;
  so allocated = used + idle + unmeasured, exactly;
- ``cpu`` = cores·s/3600, ``memory`` = GiB·s/3600 (allocated, per replica summed);
- ``cost`` = price per GPU-hour of its pool x allocated (rounded micro-GPU-hours);
- ``interrupted`` = allocated, for an attempt the scheduler stopped (``preempted`` or
  ``reclaimed``: :data:`INTERRUPTIONS`), else 0: hours whose work is done again unless
  the job saved a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from allotment.domain.lifecycle import JobState

MICRO = 1_000_000
"""Micro-units in one unit: figures are integers of these."""

HOUR = 3600
GIB = 2**30
MILLI = 1000

INTERRUPTIONS = (JobState.PREEMPTED.value, JobState.RECLAIMED.value)
"""The states of an attempt that the scheduler stopped before it ended on its own."""


def to_micro(value: Fraction) -> int:
    """``value`` in micro-units, rounded half to even."""
    return round(value * MICRO)


def from_micro(value: int) -> float:
    """Micro-units as a float; its shortest repr is the exact decimal for any figure
    below 10⁹ units, so JSON readers that parse decimals get the exact value."""
    return value / MICRO


@dataclass(frozen=True, slots=True)
class Window:
    """The report's time span, ``[since, until)`` in seconds since the epoch."""

    since: float
    until: float

    def clip(self, start: float, end: float) -> tuple[float, float] | None:
        """``[start, end)`` clipped to the window; ``None`` when nothing is left."""
        lo, hi = max(start, self.since), min(end, self.until)
        return (lo, hi) if hi > lo else None


@dataclass(frozen=True, slots=True)
class UsageSample:
    """One ``job_usage`` row: ``util`` percent over ``[start, start + length)``."""

    start: float
    length: float
    util: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptInput:
    """What accounting needs of one attempt: its job's labels, where and how long it
    held what (amounts in milli-units as the store keeps them), and its samples."""

    job: str
    attempt: int
    tenant: str
    queue: str
    user: str
    type: str
    priority_class: str
    state: str
    failure_class: str | None
    pool: str
    start: float
    end: float | None
    gpu_milli: int
    cpu_milli: int
    memory_milli: int
    samples: tuple[UsageSample, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    """Additive figures in micro-units; see the module docstring."""

    allocated: int = 0
    used: int = 0
    idle: int = 0
    unmeasured: int = 0
    cpu: int = 0
    memory: int = 0
    cost: int = 0
    interrupted: int = 0

    def __add__(self, other: Figures) -> Figures:
        return Figures(
            allocated=self.allocated + other.allocated,
            used=self.used + other.used,
            idle=self.idle + other.idle,
            unmeasured=self.unmeasured + other.unmeasured,
            cpu=self.cpu + other.cpu,
            memory=self.memory + other.memory,
            cost=self.cost + other.cost,
            interrupted=self.interrupted + other.interrupted,
        )

    @property
    def measured(self) -> int:
        return self.used + self.idle


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptRecord:
    """One attempt's share of the window: its labels, clipped span and figures."""

    input: AttemptInput
    held_from: float
    held_until: float
    open: bool
    """Still holding its allocation at the window's end."""
    figures: Figures
    price: float

    @property
    def seconds(self) -> float:
        return self.held_until - self.held_from

    @property
    def gpus(self) -> float:
        return self.input.gpu_milli / MILLI


def covered(samples: Iterable[UsageSample], lo: float, hi: float) -> tuple[float, float]:
    """Seconds of ``[lo, hi)`` covered by measured samples, and the utilisation-weighted
    seconds (sum of len x util/100, util clamped to 0..100), each instant counted once
    (the earlier sample wins). Samples without a finite utilisation are unmeasured."""
    lengths: list[float] = []
    busy: list[float] = []
    reached = lo
    for sample in sorted(samples, key=lambda s: (s.start, s.length)):
        util = sample.util
        if util is None or not math.isfinite(util) or not math.isfinite(sample.start):
            continue
        if not sample.length > 0:
            continue
        a = max(sample.start, reached)
        b = min(sample.start + sample.length, hi)
        if not b > a:
            continue
        lengths.append(b - a)
        busy.append((b - a) * min(max(util, 0.0), 100.0) / 100)
        reached = b
    return math.fsum(lengths), math.fsum(busy)


def attempt_record(
    item: AttemptInput, window: Window, price: float, *, now: float | None = None
) -> AttemptRecord | None:
    """The attempt's figures within ``window`` at ``price`` per GPU-hour; ``None`` when
    it held nothing in the window. An open attempt counts up to the window's end, or up
    to ``now`` when that is earlier (nothing is charged for the future)."""
    if item.end is not None:
        end = item.end
    else:
        end = window.until if now is None else min(window.until, now)
    span = window.clip(item.start, end)
    if span is None:
        return None
    lo, hi = span
    seconds = Fraction(hi) - Fraction(lo)
    gpus = Fraction(item.gpu_milli, MILLI)
    measured_s, busy_s = covered(item.samples, lo, hi)
    allocated = to_micro(gpus * seconds / HOUR)
    # Sums of floats may pass their bounds by an ulp: keep used <= measured <= allocated.
    measured = min(allocated, to_micro(gpus * Fraction(measured_s) / HOUR))
    used = min(measured, to_micro(gpus * Fraction(busy_s) / HOUR))
    figures = Figures(
        allocated=allocated,
        used=used,
        idle=measured - used,
        unmeasured=allocated - measured,
        cpu=to_micro(Fraction(item.cpu_milli, MILLI) * seconds / HOUR),
        memory=to_micro(Fraction(item.memory_milli, MILLI * GIB) * seconds / HOUR),
        cost=round(Fraction(repr(float(price))) * allocated),
        interrupted=allocated if item.state in INTERRUPTIONS else 0,
    )
    return AttemptRecord(
        input=item,
        held_from=lo,
        held_until=hi,
        open=item.end is None or item.end > window.until,
        figures=figures,
        price=price,
    )


def records_for(
    items: Iterable[AttemptInput],
    window: Window,
    price_of: Callable[[str], float],
    *,
    now: float | None = None,
) -> list[AttemptRecord]:
    """The records of ``items`` that held something in ``window``, in job and attempt
    order; ``price_of(pool)`` is the pool's price per GPU-hour; open attempts count up
    to ``now`` when it is before the window's end."""
    records = [attempt_record(item, window, price_of(item.pool), now=now) for item in items]
    kept = [r for r in records if r is not None]
    kept.sort(key=lambda r: (r.input.job, r.input.attempt))
    return kept


GROUPINGS: dict[str, Callable[[AttemptInput], str]] = {
    "tenant": lambda a: a.tenant,
    "queue": lambda a: a.queue,
    "pool": lambda a: a.pool,
    "user": lambda a: a.user,
    "type": lambda a: a.type,
}
"""What ``by`` may name, and the label each groups attempts by."""


@dataclass(slots=True)
class Group:
    """The sum of the records of one group."""

    key: str
    figures: Figures = field(default_factory=Figures)
    attempts: int = 0
    jobs: set[str] = field(default_factory=set)

    def add(self, record: AttemptRecord) -> None:
        self.figures = self.figures + record.figures
        self.attempts += 1
        self.jobs.add(record.input.job)


def group(records: Sequence[AttemptRecord], by: str) -> list[Group]:
    """Records summed per value of ``by`` (a key of :data:`GROUPINGS`), by key."""
    label = GROUPINGS[by]
    groups: dict[str, Group] = {}
    for record in records:
        key = label(record.input)
        groups.setdefault(key, Group(key=key)).add(record)
    return [groups[k] for k in sorted(groups)]


def total(records: Sequence[AttemptRecord]) -> Group:
    """Every record summed."""
    whole = Group(key="total")
    for record in records:
        whole.add(record)
    return whole


@dataclass(frozen=True, slots=True)
class Bucket:
    """Average GPUs over ``[start, end)``: allocated, covered by samples, and used."""

    start: float
    end: float
    allocated: float
    measured: float
    used: float


def timeline(records: Sequence[AttemptRecord], window: Window, buckets: int) -> list[Bucket]:
    """The window cut into ``buckets`` equal spans, each with the average GPUs the
    records held, held under measurement, and used in it (for charts; floats)."""
    length = (window.until - window.since) / buckets
    edges = [window.since + i * length for i in range(buckets)] + [window.until]
    spans = [edges[i + 1] - edges[i] for i in range(buckets)]
    alloc = [0.0] * buckets
    measured = [0.0] * buckets
    used = [0.0] * buckets
    for record in records:
        gpus = record.gpus
        if gpus <= 0:
            continue
        offset = (record.held_from - window.since) // length if length > 0 else 0.0
        first = max(0, min(buckets - 1, int(offset) if math.isfinite(offset) else 0))
        for i in range(first, buckets):
            if edges[i] >= record.held_until:
                break
            a, b = max(edges[i], record.held_from), min(edges[i + 1], record.held_until)
            if b <= a:
                continue
            alloc[i] += gpus * (b - a)
            seconds, busy = covered(record.input.samples, a, b)
            measured[i] += gpus * seconds
            used[i] += gpus * busy
    return [
        Bucket(
            start=edges[i],
            end=edges[i + 1],
            # A span too small for the floats around it (a tiny window far from 0) has
            # width 0: it holds nothing, so it averages 0 rather than dividing by zero.
            allocated=alloc[i] / spans[i] if spans[i] > 0 else 0.0,
            measured=measured[i] / spans[i] if spans[i] > 0 else 0.0,
            used=used[i] / spans[i] if spans[i] > 0 else 0.0,
        )
        for i in range(buckets)
    ]
