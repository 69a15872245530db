"""Start-time forecasts on a running session, with run times learned from history.

Most jobs do not say how long they will run, and the scheduler must not pretend to know.
To tell a waiting job when it will start, :func:`forecast_start` copies the session and
plays its cycles forward with *guessed* end times from a :class:`RuntimeHistory` of
finished jobs, kind by kind: the same user's jobs in the same queue and of the same size,
else the same user's in the same queue, else the queue's of the same size, else the
queue's, else all (a user is known where the caller names each job's, ``owners``);
:func:`forecast_starts` does it once for every waiting job:

- a running job will run for the mean of the residual lives of past jobs like it that
  ran at least as long as it has run so far, the longest :data:`TRIM` of them left out
  (a job that outlived every job like it is expected to run as long again);
- a job not yet started will run for the median run time of jobs like it;
- a job that declares a limit (``max_runtime``) never runs past it, and once jobs with a
  limit have finished, it is expected to use the mean share of its limit that they used
  (of those that used at least the share it has used so far);
- a job that declares its expected runtime ends then.

The copy is scheduled exactly as the real session would be (the guesses are the
forecaster's, never shown to the scheduler); no arrivals are assumed. Pure: no clock, no
I/O.

Why these statistics (measured on the Philly window, see the README): behind a long
backlog a job waits for the ends of many running jobs, and the median of each one's
residual life makes them end too early (the sum of medians of right-skewed lives is
biased low), so running jobs take the expected residual life; the very longest lives
(weeks) are left out, or a handful of them would push every forecast late. For the jobs
of the backlog itself the median did better than any mean: those weeks-long jobs only
hold a GPU beyond the horizon of the forecast. Shares of a declared limit are bounded, so
their mean is safe.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import replace
from itertools import accumulate

from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import RunningJob

MIN_SAMPLES = 10
"""Fewer finished jobs than this of a kind: fall back to a wider kind."""
TRIM = 0.05
"""The share of the longest residual lives left out of a running job's expected one."""
DEFAULT_HORIZON = 30 * 86400.0
DEFAULT_MAX_STEPS = 20_000


class _Window:
    """The last ``size`` values of one kind, kept sorted (with their running sums, made
    again when first needed after a change)."""

    __slots__ = ("_sums", "order", "size", "sorted")

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: deque[float] = deque()
        self.sorted: list[float] = []
        self._sums: list[float] | None = None

    def add(self, value: float) -> None:
        self.order.append(value)
        insort(self.sorted, value)
        if len(self.order) > self.size:
            old = self.order.popleft()
            del self.sorted[bisect_right(self.sorted, old) - 1]
        self._sums = None

    def median_beyond(self, elapsed: float) -> float | None:
        """The median of the values above ``elapsed``; None if there are none."""
        first = bisect_right(self.sorted, elapsed)
        left = len(self.sorted) - first
        if left == 0:
            return None
        return self.sorted[first + left // 2]

    def mean_beyond(self, elapsed: float, trim: float = 0.0) -> float | None:
        """The mean of the values above ``elapsed``, the largest ``trim`` share of them
        left out (at least one kept); None if there are none."""
        first = bisect_right(self.sorted, elapsed)
        left = len(self.sorted) - first
        if left == 0:
            return None
        if self._sums is None:
            self._sums = list(accumulate(self.sorted, initial=0.0))
        keep = max(1, round(left * (1.0 - trim)))
        return (self._sums[first + keep] - self._sums[first]) / keep


class RuntimeHistory:
    """Run times of finished jobs, by user, queue and GPUs, by user and queue, by queue
    and GPUs, by queue, and overall (the last ``window`` of each kind); for jobs that
    declared a limit, also the share of it they used, by the same kinds. A question is
    answered from the first kind, in that order, with :data:`MIN_SAMPLES` finished jobs.

    A user comes first because people run the same work again and again: one user's
    fine-tuning runs of an hour tell more about the next one than the queue's mix of
    notebooks and week-long trainings (schedulers that guess durations from history,
    such as Helios's QSSF, start from the user's past jobs too). Without a user (Philly
    names none) the kinds start at the queue. On the Philly window the last 100,000
    beat the last 10,000 and 2,000 (more of the rare long jobs)."""

    def __init__(self, *, window: int = 100_000) -> None:
        self.window = window
        self._kinds: dict[Hashable, _Window] = {}
        self._shares: dict[Hashable, _Window] = {}

    def record(
        self,
        queue: str,
        gpus: int,
        seconds: float,
        *,
        limit: float | None = None,
        user: str | None = None,
    ) -> None:
        """A job of ``queue`` (and ``user``, if known) holding ``gpus`` milli-GPUs ran
        ``seconds`` in all, under a declared ``limit`` (seconds) if it had one."""
        for kind in _kinds(queue, gpus, user):
            self._window(self._kinds, kind).add(seconds)
            if limit is not None and limit > 0:
                self._window(self._shares, kind).add(seconds / limit)

    def _window(self, kinds: dict[Hashable, _Window], kind: Hashable) -> _Window:
        found = kinds.get(kind)
        if found is None:
            found = kinds[kind] = _Window(self.window)
        return found

    def remaining(
        self,
        queue: str,
        gpus: int,
        elapsed: float,
        *,
        limit: float | None = None,
        user: str | None = None,
    ) -> float | None:
        """How much longer a running job that has run ``elapsed`` seconds will likely
        run: the mean residual life of the jobs like it that ran longer, the longest
        :data:`TRIM` left out; as long again when it outlived them all; never past its
        ``limit``. None when nothing has finished yet."""
        if limit is not None:
            share = self._share_beyond(queue, gpus, elapsed, limit, user)
            if share is not None:
                return _within(share * limit - elapsed, elapsed, limit)
        for kind in _kinds(queue, gpus, user):
            found = self._kinds.get(kind)
            if found is None or len(found.sorted) < MIN_SAMPLES:
                continue
            mean = found.mean_beyond(elapsed, TRIM)
            left = elapsed if mean is None else mean - elapsed
            return _within(left, elapsed, limit)
        return None

    def runtime(
        self, queue: str, gpus: int, *, limit: float | None = None, user: str | None = None
    ) -> float | None:
        """How long a job not yet started will likely run: the median run time of jobs
        like it, or the mean share of its ``limit`` that jobs like it used, never more
        than the limit. None without history."""
        if limit is not None:
            share = self._share_beyond(queue, gpus, 0.0, limit, user)
            if share is not None:
                return _within(share * limit, 0.0, limit)
        for kind in _kinds(queue, gpus, user):
            found = self._kinds.get(kind)
            if found is None or len(found.sorted) < MIN_SAMPLES:
                continue
            median = found.median_beyond(0.0)
            return _within(1.0 if median is None else median, 0.0, limit)
        return None

    def _share_beyond(
        self, queue: str, gpus: int, elapsed: float, limit: float, user: str | None
    ) -> float | None:
        """The mean share of their limits used by the jobs like this one that used more
        than it has (``elapsed`` of ``limit``); None without enough of them."""
        if limit <= 0:
            return None
        for kind in _kinds(queue, gpus, user):
            found = self._shares.get(kind)
            if found is None or len(found.sorted) < MIN_SAMPLES:
                continue
            return found.mean_beyond(elapsed / limit)
        return None


def _kinds(queue: str, gpus: int, user: str | None) -> tuple[Hashable, ...]:
    """The kinds a job of ``queue``, ``gpus`` and ``user`` belongs to, the narrowest
    first (a user's kinds are tagged, so that no user's name can pass for a size)."""
    if user is None:
        return ((queue, gpus), queue, None)
    return (("user", queue, user, gpus), ("user", queue, user), (queue, gpus), queue, None)


def _within(left: float, elapsed: float, limit: float | None) -> float:
    """``left`` seconds more, at least one, and not past ``limit`` when there is one."""
    if limit is not None:
        left = min(left, limit - elapsed)
    return max(left, 1.0)


def _left(
    history: RuntimeHistory,
    job: RunningJob,
    clock: float,
    owners: Mapping[str, str],
    *,
    started: bool,
) -> float | None:
    """How much longer ``job`` will run from ``clock``: until its declared expected end
    when it has one, else as ``history`` guesses for its user in ``owners`` (if named)
    (``started``: it starts at ``clock``)."""
    if job.expected_end is not None:
        return max(job.expected_end - clock, 1.0)
    gpus = job.total().get("gpu", 0)
    limit = None if job.max_end is None else job.max_end - job.start_time
    user = owners.get(job.id)
    if started:
        return history.runtime(job.queue, gpus, limit=limit, user=user)
    elapsed = max(0.0, clock - job.start_time)
    return history.remaining(job.queue, gpus, elapsed, limit=limit, user=user)


def forecast_start(
    session: Session,
    job_id: str,
    history: RuntimeHistory,
    *,
    now: float,
    horizon: float = DEFAULT_HORIZON,
    max_steps: int = DEFAULT_MAX_STEPS,
    owners: Mapping[str, str] | None = None,
) -> float | None:
    """When the pending job ``job_id`` will likely start: ``now`` if it would start at
    once, None when it cannot be told (no history yet, past ``horizon`` or
    ``max_steps`` cycles). ``owners``: each job's user, where known. ``session`` is not
    changed."""
    if session.pending_job(job_id) is None:
        return None
    starts = forecast_starts(
        session,
        history,
        now=now,
        horizon=horizon,
        max_steps=max_steps,
        until=job_id,
        owners=owners,
    )
    return starts.get(job_id)


def forecast_starts(
    session: Session,
    history: RuntimeHistory,
    *,
    now: float,
    horizon: float = DEFAULT_HORIZON,
    max_steps: int = DEFAULT_MAX_STEPS,
    until: str | None = None,
    owners: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """When each pending job will likely start, for those that start within ``horizon``
    and ``max_steps`` cycles and before a job whose run time cannot be guessed does (none
    at all without history for the running jobs); with ``until``, the play stops once
    that job starts. ``owners`` names each job's user, where known (its run time is
    guessed from that user's jobs first). ``session`` is not changed."""
    users: Mapping[str, str] = {} if owners is None else owners
    fork = Session.from_snapshot(session.snapshot(now))
    starts: dict[str, float] = {}
    ends: list[tuple[float, str]] = []
    for job in fork.running.values():
        left = _left(history, job, now, users, started=False)
        if left is None:
            return starts
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
            starts[admit.job] = clock
            if admit.job == until:
                return starts
            runtime = _left(history, fork.running[admit.job], clock, users, started=True)
            if runtime is None:
                return starts
            heapq.heappush(ends, (clock + runtime, admit.job))
        if not fork.pending_count:
            return starts
        if decisions.preemptions or decisions.stats.get("truncated"):
            continue
        later = ends[0][0] if ends else None
        wake = decisions.next_wakeup
        if wake is not None and (later is None or wake < later):
            later = wake
        if later is None or later - now > horizon:
            return starts
        clock = max(clock, later)
        while ends and ends[0][0] <= clock:
            _, gone = heapq.heappop(ends)
            fork.gone(gone)
    return starts
