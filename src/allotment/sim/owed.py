"""Owed waits: jobs that waited while their queue had room in its own guarantee.

A job's *owed wait* is the time, between its submission and its first start (or the
end of the replay, for one that never started), during which its queue held no more
GPUs than its nominal quota (summed over pools) minus the job's own GPUs: the queue
was below its guarantee by at least the job's size, and the job still waited. A job
whose owed wait passes :data:`OWED_AFTER_S` counts in ``owed_waits``. It is the
count an outside checker makes from the jobs and their attempts alone, without
asking why (fragmentation by the queue's own jobs, a head of the same queue in
front, a reclaim under way all count), so it is stricter than
``guarantee_violations``, which counts only a queue's first waiting job that fits its
unused guarantee where other queues hold part of it.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from itertools import accumulate

from allotment.sim.results import Attempt, JobResult

OWED_AFTER_S = 300.0
"""A job counts once its owed wait passes this (five minutes)."""


class _Usage:
    """One queue's GPUs held over time, as steps: ``held[k]`` from ``times[k]`` on."""

    def __init__(self, attempts: Sequence[Attempt], end: float) -> None:
        changes: dict[float, int] = {}
        for a in attempts:
            if a.start is None:
                continue
            changes[a.start] = changes.get(a.start, 0) + a.gpus
            stop = a.end if a.end is not None else end
            changes[stop] = changes.get(stop, 0) - a.gpus
        self.times = sorted(changes)
        self.held = list(accumulate(changes[t] for t in self.times))
        self._room: dict[int, list[float]] = {}

    def room_seconds(self, limit: int, start: float, end: float) -> float:
        """Seconds within [start, end) during which the queue held at most ``limit``."""
        cumulative = self._cumulative(limit)
        return self._at(cumulative, limit, end) - self._at(cumulative, limit, start)

    def _cumulative(self, limit: int) -> list[float]:
        """Seconds with at most ``limit`` held, from the first step to each step."""
        known = self._room.get(limit)
        if known is None:
            known = [0.0]
            for k in range(len(self.times) - 1):
                span = self.times[k + 1] - self.times[k]
                known.append(known[-1] + (span if self.held[k] <= limit else 0.0))
            self._room[limit] = known
        return known

    def _at(self, cumulative: list[float], limit: int, t: float) -> float:
        """Seconds with at most ``limit`` (never negative) held from the first step to
        ``t``; before the first step the queue held nothing, so every second counts
        (negative for ``t`` before it: only differences are used)."""
        if not self.times:
            return t
        k = bisect.bisect_right(self.times, t) - 1
        if k < 0:
            return t - self.times[0]
        inside = t - self.times[k] if self.held[k] <= limit else 0.0
        return cumulative[k] + inside


def owed_waits(
    jobs: Sequence[JobResult],
    attempts: Sequence[Attempt],
    nominal: Mapping[str, int],
    *,
    after_s: float = OWED_AFTER_S,
) -> dict[str, int]:
    """Per queue (and ``""`` for all), the jobs whose owed wait passed ``after_s``.
    ``nominal`` is each queue's nominal GPUs (milli), summed over pools; a queue with
    none owes nothing."""
    end = max(
        [a.end for a in attempts if a.end is not None] + [j.submit for j in jobs], default=0.0
    )
    by_queue: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        by_queue.setdefault(attempt.queue, []).append(attempt)
    usage = {queue: _Usage(found, end) for queue, found in by_queue.items()}
    counts: dict[str, int] = {"": 0}
    for job in jobs:
        counts.setdefault(job.queue, 0)
        guarantee = nominal.get(job.queue, 0)
        if guarantee <= 0 or job.gpus > guarantee:
            continue
        started = job.first_start if job.first_start is not None else end
        if started - job.submit <= after_s:
            continue
        queue_usage = usage.get(job.queue) or _Usage((), end)
        owed = queue_usage.room_seconds(guarantee - job.gpus, job.submit, started)
        if owed > after_s:
            counts[job.queue] += 1
            counts[""] += 1
    return counts
