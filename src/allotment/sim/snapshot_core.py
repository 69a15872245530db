"""A scheduler given as a function of a snapshot, made to look like a :class:`Session`.

Tests and experiments replay with a function from a whole snapshot to decisions (e.g.
``schedule_once``) instead of the incremental core; this adapter keeps the pending and
running sets such a function needs and hands it all of them every cycle, so that the
replay driver treats both kinds of core alike.
"""

from __future__ import annotations

from collections.abc import Callable

from allotment.domain.cluster import Cluster
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.session import MovedJobs, carry_nominations, victims_gone
from allotment.scheduler.snapshot import PendingJob, RunningJob, SchedulerPolicy, Snapshot
from allotment.sim.errors import ReplayError

Scheduler = Callable[[Snapshot], Decisions]
"""A function from a snapshot to decisions, e.g. ``schedule_once``."""


class SnapshotCore:
    """A :class:`Session`-shaped adapter around a snapshot function: the whole pending
    and running sets are handed to ``schedule`` every cycle."""

    def __init__(self, cluster: Cluster, policy: SchedulerPolicy, schedule: Scheduler) -> None:
        self.cluster = cluster
        self.policy = policy
        self.schedule = schedule
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.moved = MovedJobs()

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    def submit(self, job: PendingJob) -> None:
        job = self.moved.returning(job)
        self.pending[job.id] = job

    def update(self, job: PendingJob) -> None:
        self.pending[job.id] = job

    def pending_job(self, job_id: str) -> PendingJob | None:
        return self.pending.get(job_id)

    def withdraw(self, job_id: str) -> PendingJob | None:
        return self.pending.pop(job_id, None)

    def gone(self, job_id: str) -> RunningJob | None:
        return self.running.pop(job_id, None)

    def cycle(self, now: float, *, explain: bool = True) -> Decisions:
        self.moved.still_running(self.running)
        preemptors = (j for j in self.pending.values() if j.nominated)
        had_turn = victims_gone(preemptors, self.running)
        decisions = self.schedule(
            Snapshot(
                now=now,
                cluster=self.cluster,
                pending=list(self.pending.values()),
                running=list(self.running.values()),
                policy=self.policy,
            )
        )
        for admit in decisions.admitted:
            job = self.pending.pop(admit.job, None)
            if job is None:
                state = "running" if admit.job in self.running else "not pending"
                raise ReplayError(f"the scheduler admitted job {admit.job}, which is {state}")
            self.running[job.id] = admit.running(job, at=now)
        carry_nominations(decisions, had_turn, self.pending_job, self.update)
        self.moved.record(decisions)
        return decisions
