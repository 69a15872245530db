"""The control loop's writes of a cycle's decisions and of its launches, set-based.

Each function runs inside the caller's transaction: it locks the rows it moves in one
query (in id order), checks what it finds, and writes the moves with
:func:`~allotment.store.jobs.transition_jobs` (one batch of job updates, one of events,
one of attempt updates) instead of one round of ORM work per job. What is written is
what moving each job with :func:`~allotment.store.jobs.transition_job` wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session as DbSession

from allotment.control.launch import LaunchFailure
from allotment.domain.errors import NotFound
from allotment.domain.lifecycle import ACTIVE, FailureClass, JobState
from allotment.scheduler.decisions import Admit, Preempt
from allotment.store.allocations import allocation_json
from allotment.store.jobs import StateChange, job_states, transition_jobs
from allotment.store.models import Attempt

_S = JobState


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """A lifecycle move the loop made, for callers and logs."""

    job: str
    source: JobState
    target: JobState
    failure: FailureClass | None = None


def admit(db: DbSession, admitted: Sequence[Admit], now: float) -> list[str]:
    """Give each admitted job its attempt row and move it to ``admitted``; return the
    jobs no longer pending (cancelled since the session read them), whose admission is
    void. Raises :class:`NotFound` for a job the store does not have."""
    found = job_states(db, [a.job for a in admitted], for_update=True)
    withdrawn: list[str] = []
    attempts: list[dict[str, Any]] = []
    changes: list[StateChange] = []
    for decision in admitted:
        held = found.get(decision.job)
        if held is None:
            raise NotFound("job", decision.job)
        state, last = held
        if state is not _S.PENDING:
            withdrawn.append(decision.job)
            continue
        number = last + 1
        attempts.append(
            {
                "job_id": decision.job,
                "number": number,
                "state": _S.ADMITTED.value,
                "start_time": now,
                "pool": decision.pool,
                "allocation": allocation_json(decision.placements),
                "borrowed": dict(decision.borrowed),
            }
        )
        changes.append(
            StateChange(
                job_id=decision.job,
                source=state,
                target=_S.ADMITTED,
                message="admitted",
                detail={
                    "attempt": number,
                    "pool": decision.pool,
                    "borrowed": dict(decision.borrowed),
                    "backfilled": decision.backfilled,
                },
                values={"attempt": number},
            )
        )
    if attempts:
        db.execute(insert(Attempt), attempts)
    transition_jobs(db, changes, at=now)
    return withdrawn


def preempt(db: DbSession, preemptions: Sequence[Preempt], now: float) -> list[str]:
    """Move each victim that still holds its allocation to ``preempted`` (its attempt
    with it); return them, in the order of the decisions."""
    found = job_states(
        db, [v.job for decision in preemptions for v in decision.victims], for_update=True
    )
    victims: list[str] = []
    changes: list[StateChange] = []
    for decision in preemptions:
        for victim in decision.victims:
            held = found.get(victim.job)
            if held is None or held[0] not in ACTIVE:
                continue
            state, attempt = held
            changes.append(
                StateChange(
                    job_id=victim.job,
                    source=state,
                    target=_S.PREEMPTED,
                    message=victim.message,
                    detail={"cause": victim.cause, "preemptor": decision.job},
                    attempt=attempt,
                )
            )
            found[victim.job] = (_S.PREEMPTED, attempt)  # a second mention is no move
            victims.append(victim.job)
    transition_jobs(db, changes, at=now)
    return victims


def launched(
    db: DbSession,
    attempts: Sequence[tuple[str, int, int]],
    failures: Mapping[str, LaunchFailure | None],
    now: float,
) -> list[Move]:
    """Move each launched job (``(job, attempt, replicas)``) still ``admitted`` on that
    attempt to ``starting``, or to ``failed`` when its launch failed; return the moves.
    Raises :class:`NotFound` for a job the store does not have."""
    found = job_states(db, [job_id for job_id, _n, _r in attempts], for_update=True)
    moves: list[Move] = []
    changes: list[StateChange] = []
    for job_id, number, replicas in attempts:
        held = found.get(job_id)
        if held is None:
            raise NotFound("job", job_id)
        if held != (_S.ADMITTED, number):
            continue
        failure = failures[job_id]
        if failure is None:
            change = StateChange(
                job_id=job_id,
                source=_S.ADMITTED,
                target=_S.STARTING,
                message="launched",
                detail={"attempt": number, "replicas": replicas},
                attempt=number,
            )
        else:
            change = StateChange(
                job_id=job_id,
                source=_S.ADMITTED,
                target=_S.FAILED,
                message=failure.message,
                failure=failure.failure,
                attempt=number,
            )
        changes.append(change)
        moves.append(
            Move(job=job_id, source=_S.ADMITTED, target=change.target, failure=change.failure)
        )
    transition_jobs(db, changes, at=now)
    return moves
