"""Store rows as the scheduler sees them: pending jobs, running jobs, a whole snapshot.

Used by the control loop (to rebuild its session) and by the API (to explain a job
without touching the loop). Functions read through the given session and never write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Select, and_, func, select
from sqlalchemy.orm import Session as DbSession

from allotment.domain.cluster import Cluster
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import ACTIVE, JobState
from allotment.scheduler.snapshot import (
    PendingJob,
    RunningJob,
    SchedulerPolicy,
    Snapshot,
    pending_from_spec,
)
from allotment.store.allocations import placements_from_json
from allotment.store.models import Attempt, Event, Job

_T = TypeVar("_T", bound=tuple[Any, ...])


def pending_of(job: Job, cluster: Cluster) -> PendingJob:
    """The scheduler's view of a stored job that waits for admission."""
    return pending_from_spec(
        job.id,
        JobSpec.model_validate(job.spec),
        cluster,
        submit_time=job.submit_time,
        not_before=job.not_before,
    )


def running_of(job: Job, attempt: Attempt, cluster: Cluster) -> RunningJob:
    """The scheduler's view of a stored job holding the allocation of ``attempt``."""
    pending = pending_of(job, cluster)
    start = attempt.start_time if attempt.start_time is not None else job.updated_at
    return RunningJob(
        id=job.id,
        queue=pending.queue,
        priority_class=pending.priority_class,
        pool=attempt.pool or "",
        start_time=start,
        placements=placements_from_json(attempt.allocation),
        expected_end=(
            None if pending.expected_runtime is None else start + pending.expected_runtime
        ),
        max_end=None if pending.max_runtime is None else start + pending.max_runtime,
        preemptible=pending.preemptible,
        submit_time=job.submit_time,
    )


def open_attempts(
    db: DbSession, *, lock: bool = False, states: Iterable[JobState] | None = None
) -> list[tuple[Job, Attempt]]:
    """Jobs whose latest attempt has not ended, in submission order (only those in
    ``states`` when given, filtered in the query); ``lock`` locks their job rows until
    the transaction ends (PostgreSQL), so that their moves may skip reading each row
    again."""
    query = _open(select(Job, Attempt))
    if states is not None:
        query = query.where(Job.state.in_([JobState(s).value for s in states]))
    if lock:
        query = query.with_for_update(of=Job)
    return [(job, attempt) for job, attempt in db.execute(query).tuples()]


def _open(query: Select[_T]) -> Select[_T]:
    """``query`` on jobs joined to their latest attempt, where it has not ended, in
    submission order."""
    return (
        query.join(Attempt, and_(Attempt.job_id == Job.id, Attempt.number == Job.attempt))
        .where(Attempt.end_time.is_(None))
        .order_by(Job.submit_time, Job.id)
    )


class OpenAttempt(NamedTuple):
    """The columns of an open attempt (and of its job) that the loop's ``observe`` needs."""

    job: str
    state: str
    number: int
    allocation: list[Any]
    exit_code: int | None
    signal: int | None


def open_attempt_rows(db: DbSession, *, lock: bool = False) -> list[OpenAttempt]:
    """:func:`open_attempts` without whole rows (no spec): only the columns of
    :class:`OpenAttempt`, in submission order; ``lock`` locks the job rows likewise."""
    query = _open(
        select(Job.id, Job.state, Attempt.number, Attempt.allocation).add_columns(
            Attempt.exit_code, Attempt.signal
        )
    )
    if lock:
        query = query.with_for_update(of=Job)
    return [OpenAttempt(*row) for row in db.execute(query).tuples()]


def last_event_id(db: DbSession) -> int:
    """The newest event's id (0: none yet). Every job written (submitted, moved, given a
    new reason) adds an event, so it moves whenever what the scheduler sees of the jobs
    does; one index lookup."""
    return db.scalar(select(func.max(Event.id))) or 0


def pending_rows(db: DbSession) -> Sequence[Job]:
    """Jobs in state ``pending``, in submission order."""
    query = select(Job).where(Job.state == JobState.PENDING.value).order_by(Job.submit_time, Job.id)
    return db.scalars(query).all()


def snapshot_from_store(
    db: DbSession,
    cluster: Cluster,
    *,
    now: float,
    policy: SchedulerPolicy | None = None,
    owners: dict[str, str] | None = None,
) -> Snapshot:
    """What the store holds, as one scheduler snapshot at ``now``: every open attempt
    holds its allocation (``terminating`` when its job is no longer active), every
    pending job waits. Nominations the live loop keeps in memory are not known here.
    ``owners``, when given, is filled with the user of each job in the snapshot (the
    scheduler never sees users; start forecasts learn run times per user)."""
    running: list[RunningJob] = []
    known = {} if owners is None else owners
    for job, attempt in open_attempts(db):
        held = running_of(job, attempt, cluster)
        held.terminating = JobState(job.state) not in ACTIVE
        running.append(held)
        known[job.id] = job.user
    holding = {r.id for r in running}
    pending = []
    for job in pending_rows(db):
        if job.id not in holding:
            pending.append(pending_of(job, cluster))
            known[job.id] = job.user
    return Snapshot(
        now=now,
        cluster=cluster,
        pending=pending,
        running=running,
        policy=policy if policy is not None else SchedulerPolicy(),
    )
