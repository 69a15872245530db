"""Start-time estimates: forward simulation of the same cycle.

From a snapshot, repeatedly run :func:`schedule_once`, then move the clock to the next
moment something changes: a running job's expected (else maximum) end, a back-off
expiring, a time window opening. Jobs admitted at a step get that step's time. Jobs still
waiting when nothing more is known to end get no estimate (None): some job they wait
for has no declared runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from allotment.domain.durations import next_window_open
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.snapshot import PendingJob, RunningJob, Snapshot

DEFAULT_HORIZON = 30 * 86400.0
DEFAULT_MAX_STEPS = 500


def estimate_starts(
    snapshot: Snapshot,
    *,
    horizon: float = DEFAULT_HORIZON,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> dict[str, float | None]:
    """Estimated start time (seconds since the epoch) for every pending job; None when
    it cannot be told within ``horizon`` seconds or ``max_steps`` cycles. Pure."""
    now = snapshot.now
    # Terminating jobs are about to be gone: their preemptors compete normally.
    pending: dict[str, PendingJob] = {
        j.id: replace(j, preempting=()) if j.preempting else j for j in snapshot.pending
    }
    running: dict[str, RunningJob] = {r.id: r for r in snapshot.running if not r.terminating}
    estimates: dict[str, float | None] = dict.fromkeys(pending)
    for _ in range(max_steps):
        if not pending:
            break
        decisions = schedule_once(
            replace(
                snapshot, now=now, pending=list(pending.values()), running=list(running.values())
            )
        )
        for admit in decisions.admitted:
            job = pending.pop(admit.job)
            estimates[job.id] = now
            running[job.id] = admit.running(job, at=now)
        for preempt in decisions.preemptions:
            for victim in preempt.victims:
                running.pop(victim.job, None)  # gone at once in the estimate
            job = pending[preempt.job]
            pending[preempt.job] = replace(job, preempting=())
        if decisions.admitted or decisions.preemptions:
            continue  # same instant: freed capacity may admit more
        later = _next_change(now, running.values(), pending.values(), snapshot)
        if later is None or later - snapshot.now > horizon:
            break
        now = later
        for job_id in [
            r.id for r in running.values() if r.end_bound is not None and r.end_bound <= now
        ]:
            del running[job_id]
    return estimates


def _next_change(
    now: float,
    running: Iterable[RunningJob],
    pending: Iterable[PendingJob],
    snapshot: Snapshot,
) -> float | None:
    """The next moment after ``now`` when a job ends, a back-off expires or a window
    opens; None if nothing is known to change."""
    times: list[float] = []
    for holder in running:
        end = holder.end_bound
        if end is not None:
            times.append(max(end, now + 1))
    for job in pending:
        if job.not_before is not None and job.not_before > now:
            times.append(job.not_before)
        queue = snapshot.cluster.queues.get(job.queue)
        if queue is not None and queue.time_windows:
            opens = next_window_open(queue.time_windows, now + 60)
            if opens is not None and opens > now:
                times.append(opens)
    return min(times) if times else None
