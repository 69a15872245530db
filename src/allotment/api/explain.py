"""``why``: a job's reason to wait, its position, its estimated start and the holders.

Computed from a snapshot of the store at the time of the request: one scheduling cycle
gives the reason and the queue position, the forward simulation of
:func:`~allotment.scheduler.eta.estimate_starts` the estimated start where the declared
runtimes of the work ahead tell it, else a forecast with run times learned from the
jobs that finished here (``estimate_basis`` says which). The live loop may
know a little more (nominations it keeps in memory); when the fresh cycle would admit
the job at once, the reason the loop last stored is shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy.orm import Session as DbSession

from allotment.api import schemas
from allotment.api.queue_view import SharedViews
from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import ACTIVE, WAITING, JobState
from allotment.domain.resources import GPU, MILLI
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.eta import estimate_starts
from allotment.scheduler.forecast import RuntimeHistory, forecast_start, forecast_starts
from allotment.scheduler.ordering import UNKNOWN_VALUE
from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import PendingJob, RunningJob, SchedulerPolicy, Snapshot
from allotment.store.allocations import placements_from_json
from allotment.store.history import FINISHED_RUNS, finished_runs
from allotment.store.jobs import events_for, get_job, jobs_by_id
from allotment.store.layout import replica_name
from allotment.store.models import Attempt, Job
from allotment.store.views import snapshot_from_store

MAX_HOLDERS = 50
Basis = Literal["declared", "history"]
"""What an estimated start rests on (:func:`_estimate`)."""
GUESS_WORK = 200_000
"""The most a start guessed from history may cost: cycles played forward times the jobs
waiting (each cycle looks at the lines of them all); about a second on the development
machine (README, "Estimated starts"). Where that leaves fewer than
:data:`GUESS_MIN_CYCLES`, or the job does not start within the cycles it leaves, there
is no guess."""
GUESS_MIN_CYCLES = 20
GUESS_TTL_S = 30.0
"""How long a job's guessed start is kept before it is guessed again (pages poll)."""
GUESSES_KEPT = 1024
"""How many jobs' guessed starts are kept (those asked last)."""
HIDDEN = "(another tenant)"
HOLDING = frozenset({JobState.ADMITTED, JobState.STARTING, JobState.RUNNING})


def iso_utc(at: float | None) -> str | None:
    """Seconds since the epoch as ``2026-12-01T10:20:00Z``; None stays None, and so
    does a time the calendar cannot hold (before year 1, after 9999, not finite): an
    estimate that far off is no estimate."""
    if at is None:
        return None
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return None


def natural(milli: int) -> float | int:
    """Milli-units in natural units (GPUs, cores, bytes): an int when whole."""
    return milli // MILLI if milli % MILLI == 0 else milli / MILLI


gpus = natural


def why(
    db: DbSession,
    cluster: Cluster,
    job_id: str,
    *,
    now: float,
    policy: SchedulerPolicy | None = None,
    tenant: str | None = None,
    guesses: SharedViews[str | None] | None = None,
) -> schemas.WhyOut:
    """Explain ``job_id``; raises ``NotFound``. With ``tenant``, holders of other
    tenants are shown as :data:`HIDDEN` (job and queue); ``guesses`` keeps start guesses
    from history between calls (:data:`GUESS_TTL_S`)."""
    job = get_job(db, job_id)
    state = JobState(job.state)
    if state is not JobState.PENDING:
        return schemas.WhyOut(
            job=job.id,
            state=state.value,
            reason=_ending(db, job),
            position=None,
            estimated_start=None,
            holders=[],
            placement=_placement(db, job) if state in HOLDING else None,
        )
    owners: dict[str, str] = {}
    snapshot = snapshot_from_store(db, cluster, now=now, policy=policy, owners=owners)
    decisions = schedule_once(snapshot)
    target = next((p for p in snapshot.pending if p.id == job.id), None)
    if target is None:  # it still holds its last attempt's allocation
        return schemas.WhyOut(
            job=job.id,
            state=state.value,
            reason=_reason(job, decisions),
            position=None,
            estimated_start=None,
            holders=[],
        )
    reason = _reason(job, decisions)
    start, basis = (
        (None, None) if _never(reason) else _estimate(db, snapshot, owners, job.id, guesses)
    )
    pools = _acceptable_pools(cluster, target)
    return schemas.WhyOut(
        job=job.id,
        state=state.value,
        reason=reason,
        position=schemas.Position(
            queue=decisions.position(job.id, target.queue),
            pool=_pool_position(snapshot, target, pools[0]) if pools else None,
        ),
        estimated_start=start,
        estimate_basis=basis,
        holders=_holders(snapshot, set(pools), cluster, tenant),
    )


def _estimate(
    db: DbSession,
    snapshot: Snapshot,
    owners: Mapping[str, str],
    job_id: str,
    guesses: SharedViews[str | None] | None,
) -> tuple[str | None, Basis | None]:
    """When the pending job will start (ISO UTC), and on what that rests: ``declared``
    when the declared runtimes (and limits) of the work ahead tell
    (:func:`~allotment.scheduler.eta.estimate_starts`); else ``history``, a forecast
    with run times guessed from the jobs that finished here, each job's user's first
    (``owners``; :func:`~allotment.scheduler.forecast.forecast_start`) within
    :data:`GUESS_WORK`, kept in ``guesses`` for a while; (None, None) when neither can
    tell (no history yet, too deep a backlog, or too far ahead)."""
    declared = iso_utc(estimate_starts(snapshot).get(job_id))
    if declared is not None:
        return declared, "declared"
    cycles = _guess_cycles(snapshot)
    if not cycles:
        return None, None

    def guess() -> str | None:
        session = Session.from_snapshot(snapshot)
        history = _history(db)
        start = forecast_start(
            session, job_id, history, now=snapshot.now, max_steps=cycles, owners=owners
        )
        return iso_utc(start)

    guessed = guess() if guesses is None else guesses.get(job_id, (), guess)
    return (guessed, "history") if guessed is not None else (None, None)


def _guess_cycles(snapshot: Snapshot) -> int:
    """How many cycles a guess may play forward within :data:`GUESS_WORK`; 0 when
    fewer than :data:`GUESS_MIN_CYCLES` (no guess)."""
    cycles = GUESS_WORK // max(1, len(snapshot.pending))
    return cycles if cycles >= GUESS_MIN_CYCLES else 0


def _history(db: DbSession) -> RuntimeHistory:
    """Run times of the runs that succeeded here (:func:`finished_runs`), by user too."""
    history = RuntimeHistory(window=FINISHED_RUNS)
    for run in finished_runs(db):
        history.record(run.queue, run.gpus, run.seconds, limit=run.limit, user=run.user)
    return history


def guessed_starts(db: DbSession, snapshot: Snapshot, owners: Mapping[str, str]) -> dict[str, str]:
    """Every waiting job's start guessed from history (each job's user's first:
    ``owners``) within :data:`GUESS_WORK` (ISO UTC; those that start within it), in one
    play forward (a queue's line)."""
    cycles = _guess_cycles(snapshot)
    if not cycles:
        return {}
    session = Session.from_snapshot(snapshot)
    starts = forecast_starts(
        session, _history(db), now=snapshot.now, max_steps=cycles, owners=owners
    )
    return {job: at for job, start in starts.items() if (at := iso_utc(start)) is not None}


def _never(reason: schemas.WhyReason | None) -> bool:
    """Whether the job can never run on the cluster as it is (no start to guess)."""
    return reason is not None and bool(reason.detail.get("permanent"))


def _ending(db: DbSession, job: Job) -> schemas.WhyReason | None:
    """How an ended job ended: its failure class and the message of the event that
    ended it (``None`` for a job that has not ended or succeeded)."""
    if job.failure_class is None or JobState(job.state) in WAITING | ACTIVE:
        return None
    ended = [e for e in events_for(db, job.id) if e.to_state == job.state]
    message = ended[-1].message if ended else ""
    return schemas.WhyReason(code=job.failure_class, message=message or "", detail={})


def _reason(job: Job, decisions: Decisions) -> schemas.WhyReason | None:
    if job.id in decisions.waiting:
        reason = decisions.waiting[job.id]
        return schemas.WhyReason(
            code=reason.code.value, message=reason.message, detail=dict(reason.detail)
        )
    for preempt in decisions.preemptions:
        if preempt.job == job.id:
            return schemas.WhyReason(
                code=preempt.reason.code.value,
                message=preempt.reason.message,
                detail=dict(preempt.reason.detail),
            )
    if job.reason_code is not None:
        return schemas.WhyReason(
            code=job.reason_code,
            message=job.reason_message or "",
            detail=dict(job.reason_detail or {}),
        )
    return None


def _acceptable_pools(cluster: Cluster, job: PendingJob) -> list[str]:
    """The pools the job may run in, in its order of preference."""
    queue = cluster.queues.get(job.queue)
    if queue is None:
        return [p for p in job.pools if p in cluster.pools]
    allowed = cluster.allowed_pools(queue)
    if job.pools:
        return [p for p in job.pools if p in allowed]
    return allowed


def _pool_position(snapshot: Snapshot, job: PendingJob, pool: str) -> int:
    values = {name: c.value for name, c in snapshot.cluster.priority_classes.items()}

    def key(p: PendingJob) -> tuple[int, float, str]:
        return (-values.get(p.priority_class, UNKNOWN_VALUE), p.submit_time, p.id)

    mine = key(job)
    ahead = sum(
        1
        for other in snapshot.pending
        if other.id != job.id
        and pool in _acceptable_pools(snapshot.cluster, other)
        and key(other) < mine
    )
    return ahead + 1


def _holders(
    snapshot: Snapshot, pools: set[str], cluster: Cluster, tenant: str | None
) -> list[schemas.Holder]:
    held = [r for r in snapshot.running if r.pool in pools and r.total().get(GPU, 0) > 0]
    held.sort(key=lambda r: (r.end_bound is None, r.end_bound or 0.0, r.id))

    def shown(r: RunningJob) -> bool:
        queue = cluster.queues.get(r.queue)
        return tenant is None or (queue is not None and queue.tenant == tenant)

    return [
        schemas.Holder(
            job=r.id if shown(r) else HIDDEN,
            queue=r.queue if shown(r) else HIDDEN,
            gpu=gpus(r.total().get(GPU, 0)),
            expected_end=iso_utc(r.end_bound),
            pool=r.pool,
            terminating=r.terminating,
        )
        for r in held[:MAX_HOLDERS]
    ]


def _placement(db: DbSession, job: Job) -> schemas.Placement | None:
    attempt = db.get(Attempt, (job.id, job.attempt))
    if attempt is None:
        return None
    placements = placements_from_json(attempt.allocation)
    return schemas.Placement(
        attempt=attempt.number,
        pool=attempt.pool or "",
        nodes=sorted({p.node for p in placements}),
        replicas=[
            schemas.ReplicaWhere(
                replica=replica_name(p.group, p.index),
                node=p.node,
                gpu=gpus(p.resources.get(GPU, 0)),
                devices=list(p.devices),
            )
            for p in placements
        ],
    )


def queue_line(
    db: DbSession,
    cluster: Cluster,
    queue: str,
    *,
    now: float,
    policy: SchedulerPolicy | None = None,
    guesses: Callable[[Snapshot, Mapping[str, str]], Mapping[str, str]] | None = None,
) -> list[dict[str, object]]:
    """Queue ``queue``'s waiting jobs in the order it would admit them, each with
    ``job``, ``reason`` (code and message), ``position``, ``estimated_start`` and
    ``estimate_basis``: what ``why`` says of each, from one snapshot, one cycle and one
    estimate for all; where the declared runtimes do not tell, the start ``guesses``
    gives from that snapshot and its jobs' users (e.g. :func:`guessed_starts`, kept a
    while), if any."""
    owners: dict[str, str] = {}
    snapshot = snapshot_from_store(db, cluster, now=now, policy=policy, owners=owners)
    decisions = schedule_once(snapshot)
    estimates = estimate_starts(snapshot)
    order = decisions.queue_order.get(queue, [])
    mine = {p.id for p in snapshot.pending if p.queue == queue}
    ids = [j for j in order if j in mine] + sorted(mine - set(order))
    jobs = {job.id: job for job in jobs_by_id(db, ids)}
    declared = {job_id: iso_utc(estimates.get(job_id)) for job_id in ids}
    guessed: Mapping[str, str] = {}
    if guesses is not None and not all(declared.values()):
        guessed = guesses(snapshot, owners)
    line: list[dict[str, object]] = []
    for position, job_id in enumerate(ids, start=1):
        job = jobs.get(job_id)
        if job is None:
            continue
        reason = _reason(job, decisions)
        start = declared[job_id] or (None if _never(reason) else guessed.get(job_id))
        line.append(
            {
                "job": job_id,
                "name": job.name,
                "user": job.user,
                "reason": reason.model_dump() if reason is not None else None,
                "position": position if job_id in order else None,
                "estimated_start": start,
                "estimate_basis": (
                    None if start is None else "declared" if declared[job_id] else "history"
                ),
            }
        )
    return line
