"""Start-time forecasts on a running session, with run times learned from history.

Most jobs do not say how long they will run, and the scheduler must not pretend to know.
To tell a waiting job when it will start, :func:`forecast_start` copies the session and
plays its cycles forward with *guessed* end times: a :class:`RuntimeHistory` of finished
jobs gives, for a running job, the median run time of past jobs like it (same queue and
size) that ran at least as long as it has run so far, and for a job not yet started,
the median run time of jobs like it. The copy is scheduled exactly as the real session
would be (the guesses are the forecaster's, never shown to the scheduler); no arrivals
are assumed. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Hashable
from dataclasses import replace

from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import RunningJob

MIN_SAMPLES = 10
"""Fewer finished jobs than this of a kind: fall back to a wider kind."""
DEFAULT_HORIZON = 30 * 86400.0
DEFAULT_MAX_STEPS = 20_000


class _Window:
    """The last ``size`` run times of one kind, kept sorted."""

    __slots__ = ("order", "size", "sorted")

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def add(self, seconds: float) -> None:
        self.order.append(seconds)
        insort(self.sorted, seconds)
        if len(self.order) > self.size:
            old = self.order.popleft()
            del self.sorted[bisect_right(self.sorted, old) - 1]

    def median_beyond(self, elapsed: float) -> float | None:
        """The median of the run times longer than ``elapsed``; None if there are none."""
        first = bisect_right(self.sorted, elapsed)
        left = len(self.sorted) - first
        if left == 0:
            return None
        return self.sorted[first + left // 2]


class RuntimeHistory:
    """Run times of finished jobs, by queue and GPUs, then by queue, then overall (the
    last ``window`` of each kind).

    On the Philly window the median beat the mean (which a few very long jobs drag
    late) and the last 100,000 beat the last 2,000 (more of the rare long jobs)."""

    def __init__(self, *, window: int = 100_000) -> None:
        self.window = window
        self._kinds: dict[Hashable, _Window] = {}

    def record(self, queue: str, gpus: int, seconds: float) -> None:
        """A job of ``queue`` holding ``gpus`` milli-GPUs ran ``seconds`` in all."""
        for kind in ((queue, gpus), queue, None):
            found = self._kinds.get(kind)
            if found is None:
                found = self._kinds[kind] = _Window(self.window)
            found.add(seconds)

    def remaining(self, queue: str, gpus: int, elapsed: float) -> float | None:
        """How much longer a job that has run ``elapsed`` seconds will likely run; None
        when nothing has finished yet. A job that outlived every job like it is
        expected to run as long again."""
        for kind in ((queue, gpus), queue, None):
            found = self._kinds.get(kind)
            if found is None or len(found.sorted) < MIN_SAMPLES:
                continue
            median = found.median_beyond(elapsed)
            if median is None:
                return max(elapsed, 1.0)
            return max(median - elapsed, 1.0)
        return None

    def runtime(self, queue: str, gpus: int) -> float | None:
        """How long a job not yet started will likely run; None without history."""
        return self.remaining(queue, gpus, 0.0)


def _gpus(job: RunningJob) -> int:
    return job.total().get("gpu", 0)


def forecast_start(
    session: Session,
    job_id: str,
    history: RuntimeHistory,
    *,
    now: float,
    horizon: float = DEFAULT_HORIZON,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> float | None:
    """When the pending job ``job_id`` will likely start: ``now`` if it would start at
    once, None when it cannot be told (no history yet, past ``horizon`` or
    ``max_steps`` cycles). ``session`` is not changed."""
    target = session.pending_job(job_id)
    if target is None:
        return None
    fork = Session.from_snapshot(session.snapshot(now))
    ends: list[tuple[float, str]] = []
    for job in fork.running.values():
        left = history.remaining(job.queue, _gpus(job), max(0.0, now - job.start_time))
        if left is None:
            return None
        ends.append((now + left, job.id))
    heapq.heapify(ends)
    nominated: list[str] = []
    clock = now
    for _ in range(max_steps):
        decisions = fork.cycle(clock, explain=False)
        for waiting_id in nominated:  # they had their turn first in this cycle
            waiting = fork.pending_job(waiting_id)
            if waiting is not None:
                fork.update(replace(waiting, preempting=()))
        nominated.clear()
        for preempt in decisions.preemptions:
            for victim in preempt.victims:
                fork.gone(victim.job)  # assumed gone at once; it does not come back
            waiting = fork.pending_job(preempt.job)
            if waiting is not None:
                fork.update(replace(waiting, preempting=tuple(v.job for v in preempt.victims)))
                nominated.append(preempt.job)
        for admit in decisions.admitted:
            if admit.job == job_id:
                return clock
            started = fork.running[admit.job]
            runtime = history.runtime(started.queue, _gpus(started))
            if runtime is None:
                return None
            heapq.heappush(ends, (clock + runtime, admit.job))
        if decisions.preemptions or decisions.stats.get("truncated"):
            continue
        later = ends[0][0] if ends else None
        wake = decisions.next_wakeup
        if wake is not None and (later is None or wake < later):
            later = wake
        if later is None or later - now > horizon:
            return None
        clock = max(clock, later)
        while ends and ends[0][0] <= clock:
            _, gone = heapq.heappop(ends)
            fork.gone(gone)
    return None
