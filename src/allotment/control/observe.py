"""What :meth:`~allotment.control.loop.ControlLoop.observe` makes of the executor's
statuses: planned per open attempt, then written set-based.

:func:`plan` reads and writes nothing: from one open attempt (narrow columns, no spec)
and its replicas' statuses it derives the job's moves (``starting → running``,
``→ succeeded``, ``→ failed`` with a class; up to two in one turn), the attempt's new
columns (start time, exit code and signal, end time when it closes) and the replicas to
stop. :func:`write` then writes every plan inside the caller's transaction: the first
moves of all jobs in one :func:`~allotment.store.jobs.transition_jobs` call, then the
second ones (so each job's events keep their order), and the attempts' columns in one
batch. An attempt closed for a preempted or failed job is then requeued or retried one
job at a time (:func:`~allotment.control.retries.requeue_ended`), as before: each reads
its own history (the preemption's cause, its count of failed attempts) and they are few.

What lands is what moving each job with :func:`~allotment.store.jobs.transition_job`
(and :func:`~allotment.store.jobs.sync_attempt`) and closing its attempt with
:func:`~allotment.control.retries.close_attempt` wrote: the same rows, the same events
in the same order for each job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session as DbSession

from allotment.control.launch import replica_keys
from allotment.control.retries import closed_columns, requeue_ended
from allotment.control.writes import Move
from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import ACTIVE, FailureClass, JobState
from allotment.executors.base import ReplicaKey, ReplicaPhase, ReplicaStatus
from allotment.executors.failures import classify, describe_end
from allotment.store.jobs import StateChange, jobs_by_id, transition_jobs, update_attempts
from allotment.store.models import Job
from allotment.store.views import OpenAttempt

_S = JobState


@dataclass(slots=True)
class Plan:
    """What one observation does to one open attempt and its job."""

    job: str
    number: int
    state: JobState
    """The job's state after its moves."""
    changes: list[StateChange] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    attempt: dict[str, Any] = field(default_factory=dict)
    """Columns of the attempt to write (besides its state, which follows the moves)."""
    to_stop: list[ReplicaKey] = field(default_factory=list)
    failed: bool = False
    """Moved to ``failed`` now: its other replicas are being stopped."""
    closes: bool = False
    """Every replica has ended: the attempt closes and its resources are free."""
    stopping: bool = False
    """No longer active and not asked to stop yet: its replicas are stopped now."""


def plan(
    row: OpenAttempt,
    statuses: Mapping[ReplicaKey, ReplicaStatus],
    now: float,
    *,
    stop_sent: bool,
) -> Plan | None:
    """What the replicas' statuses do to ``row``'s job and attempt (``stop_sent``: its
    replicas were asked to stop already); ``None`` when nothing (an admitted job, a
    zombie left to ``reconcile``, an active job whose replicas run on)."""
    state = _S(row.state)
    if state is _S.ADMITTED:
        return None
    keys = replica_keys(row.job, row.number, row.allocation)
    seen = {key: statuses.get(key) for key in keys}
    out = Plan(job=row.job, number=row.number, state=state)
    if state in (_S.STARTING, _S.RUNNING):
        known = {k: s for k, s in seen.items() if s is not None}
        if len(known) < len(keys):
            return None  # a zombie: reconcile() decides
        _apply(out, known, now)
    if out.state in ACTIVE:
        return out if out.changes else None
    ended = {k: s for k, s in seen.items() if s is not None}
    if all(s.ended for s in ended.values()):
        exit_code = out.attempt.get("exit_code", row.exit_code)
        signal = out.attempt.get("signal", row.signal)
        out.attempt.update(closed_columns(ended, now, exit_code, signal))
        out.closes = True
    elif not (stop_sent or out.failed):
        out.to_stop.extend(k for k, s in ended.items() if not s.ended)
        out.stopping = True
    else:
        # Lost replicas whose processes still run are stopped again until they are
        # gone: their devices are not free before.
        out.to_stop.extend(k for k, s in ended.items() if s.lingering)
    return out


def _apply(out: Plan, seen: Mapping[ReplicaKey, ReplicaStatus], now: float) -> None:
    """The moves of a starting or running job as its replicas' statuses say."""
    started = all(
        s.phase is ReplicaPhase.RUNNING or (s.ended and s.started_at is not None)
        for s in seen.values()
    )
    if out.state is _S.STARTING and started:
        _move(out, _S.RUNNING, "all replicas running")
        out.attempt["start_time"] = min(
            (s.started_at for s in seen.values() if s.started_at is not None),
            default=now,
        )
    failures: list[tuple[float, ReplicaKey, ReplicaStatus, FailureClass]] = []
    for key, status in seen.items():
        if status.over:
            klass = classify(status)
            if klass is not None:
                failures.append((status.ended_at or now, key, status, klass))
    if failures:
        _, key, status, klass = min(failures, key=lambda f: (f[0], f[1]))
        _move(
            out,
            _S.FAILED,
            f"replica {key.replica}-{key.index} ended: {describe_end(status)}",
            failure=klass,
            detail={"replica": f"{key.replica}-{key.index}", "phase": status.phase.value},
        )
        out.attempt["exit_code"] = status.exit_code
        out.attempt["signal"] = status.signal
        out.to_stop.extend(k for k, s in seen.items() if not s.ended)
        out.failed = True
    elif all(s.ended for s in seen.values()):
        _move(out, _S.SUCCEEDED, "all replicas exited 0")
        out.attempt["exit_code"] = 0


def _move(
    out: Plan,
    target: JobState,
    message: str,
    *,
    failure: FailureClass | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    out.changes.append(
        StateChange(
            job_id=out.job,
            source=out.state,
            target=target,
            message=message,
            detail=detail,
            failure=failure,
            attempt=out.number,
        )
    )
    out.moves.append(Move(job=out.job, source=out.state, target=target, failure=failure))
    out.state = target


def write(
    db: DbSession, cluster: Cluster, plans: Sequence[Plan], now: float
) -> tuple[list[Move], list[Job]]:
    """Write ``plans`` (the jobs locked by the caller's read); return the moves made, in
    the order of the plans, and the jobs gone back to ``pending``, in that order."""
    rounds = max((len(p.changes) for p in plans), default=0)
    for k in range(rounds):
        transition_jobs(db, [p.changes[k] for p in plans if len(p.changes) > k], at=now)
    update_attempts(
        db, [{"job_id": p.job, "number": p.number, **p.attempt} for p in plans if p.attempt]
    )
    ended = [p.job for p in plans if p.closes and p.state in (_S.PREEMPTED, _S.FAILED)]
    requeued: dict[str, Job] = {}
    if ended:
        rows = {job.id: job for job in jobs_by_id(db, ended)}
        for job_id in ended:
            if requeue_ended(db, cluster, rows[job_id], now):
                requeued[job_id] = rows[job_id]
    moves: list[Move] = []
    for p in plans:
        moves.extend(p.moves)
        if p.job in requeued:
            moves.append(Move(job=p.job, source=p.state, target=_S.PENDING))
    return moves, [requeued[p.job] for p in plans if p.job in requeued]
