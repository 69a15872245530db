"""Wait times: from a job's move to ``pending`` (its submission, or its requeue after a
failure or preemption) to its next admission.

A wait belongs to the window its admission falls in (``[since, until)``). A wait
that ends otherwise (the job cancelled or failed while waiting) is not a wait for
admission and is left out. A job still pending at the window's end is *waiting*; its age
then is ``until - start``. Percentiles are nearest-rank: the p-th percentile of ``n``
sorted waits is the ``ceil(p·n/100)``-th.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allotment.accounting.figures import Window

PENDING = "pending"
ADMITTED = "admitted"

HISTOGRAM_EDGES: tuple[tuple[float, str], ...] = (
    (60.0, "< 1m"),
    (300.0, "1m-5m"),
    (900.0, "5m-15m"),
    (3600.0, "15m-1h"),
    (4 * 3600.0, "1h-4h"),
    (12 * 3600.0, "4h-12h"),
    (86400.0, "12h-1d"),
    (math.inf, ">= 1d"),
)
"""Upper bounds (exclusive) and labels of the wait-time histogram's bins."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """One state transition of a job, as the events record it."""

    job: str
    at: float
    to_state: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    job: str
    queue: str
    priority_class: str
    start: float
    end: float | None
    """The admission; ``None`` while still waiting at the window's end."""


def waits(
    moves: Iterable[Move], labels: Mapping[str, tuple[str, str]], window: Window
) -> list[Wait]:
    """The waits ended by an admission within ``window``, and those still open at its
    end. ``moves`` are each job's transitions in order (at most up to the window's end);
    ``labels`` gives each job's queue and priority class."""
    by_job: dict[str, list[Move]] = {}
    for move in moves:
        by_job.setdefault(move.job, []).append(move)
    found: list[Wait] = []
    for job, history in sorted(by_job.items()):
        queue, priority_class = labels[job]
        since: float | None = None
        for move in history:
            if move.at >= window.until:
                break
            if move.to_state == PENDING:
                since = move.at
                continue
            if since is not None and move.to_state == ADMITTED and move.at >= window.since:
                found.append(
                    Wait(
                        job=job,
                        queue=queue,
                        priority_class=priority_class,
                        start=since,
                        end=move.at,
                    )
                )
            since = None
        if since is not None:
            found.append(
                Wait(job=job, queue=queue, priority_class=priority_class, start=since, end=None)
            )
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitStats:
    """Seconds; ``count`` waits ended by an admission, ``waiting`` jobs still waiting."""

    queue: str | None
    priority_class: str | None
    count: int
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    waiting: int
    waiting_max_s: float | None


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted, non-empty ``ordered``."""
    rank = max(1, math.ceil(p * len(ordered) / 100))
    return ordered[rank - 1]


def stats(
    found: Sequence[Wait], window: Window, *, queue: str | None, priority_class: str | None
) -> WaitStats:
    """The statistics of ``found`` (all of one group)."""
    done = sorted(w.end - w.start for w in found if w.end is not None)
    ages = [window.until - w.start for w in found if w.end is None]
    return WaitStats(
        queue=queue,
        priority_class=priority_class,
        count=len(done),
        mean_s=math.fsum(done) / len(done) if done else None,
        p50_s=percentile(done, 50) if done else None,
        p95_s=percentile(done, 95) if done else None,
        max_s=done[-1] if done else None,
        waiting=len(ages),
        waiting_max_s=max(ages) if ages else None,
    )


def stats_by_queue(found: Sequence[Wait], window: Window) -> list[WaitStats]:
    """One row per queue and priority class, sorted."""
    groups: dict[tuple[str, str], list[Wait]] = {}
    for wait in found:
        groups.setdefault((wait.queue, wait.priority_class), []).append(wait)
    return [
        stats(groups[key], window, queue=key[0], priority_class=key[1]) for key in sorted(groups)
    ]


def histogram(found: Iterable[Wait]) -> list[tuple[str, float, int]]:
    """Waits ended by an admission, counted per bin: (label, upper bound s, count)."""
    counts = [0] * len(HISTOGRAM_EDGES)
    for wait in found:
        if wait.end is None:
            continue
        length = wait.end - wait.start
        for i, (upper, _label) in enumerate(HISTOGRAM_EDGES):
            if length < upper:
                counts[i] += 1
                break
    return [(label, upper, counts[i]) for i, (upper, label) in enumerate(HISTOGRAM_EDGES)]
