"""The set-based writers (``transition_jobs``, ``record_reasons``, ``job_states``) write
exactly the rows and events their one-job forms write, on both stores."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from tests.store.test_jobs import T0, spec

from allotment.domain.errors import IllegalTransition
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.store.jobs import (
    StateChange,
    create_job,
    get_job,
    job_states,
    sync_attempt,
    transition_job,
    transition_jobs,
)
from allotment.store.models import Attempt, Event, Job

S = JobState

JOB_COLUMNS = ("state", "failure_class", "attempt", "updated_at", "reason_code")
JOB_COLUMNS += ("reason_message", "reason_detail", "reason_since")


def _world(sessions: sessionmaker[Session], prefix: str) -> list[str]:
    """Three pending jobs, each with an admitted first attempt but the last."""
    ids = [f"{prefix}-{i}" for i in range(3)]
    with sessions.begin() as db:
        for i, job_id in enumerate(ids):
            create_job(db, spec(), tenant="acme", user="ada", at=T0 + i, job_id=job_id)
            transition_job(db, job_id, S.PENDING, at=T0 + i, message="accepted")
    return ids


def _admit(db: Session, job_id: str) -> None:
    db.add(Attempt(job_id=job_id, number=1, state=S.ADMITTED.value, allocation=[], borrowed={}))


def _rows(sessions: sessionmaker[Session], ids: list[str]) -> list[Any]:
    """Every written column of the jobs, their attempts and their events (in id order),
    with the job id's prefix dropped."""
    with sessions() as db:
        jobs = [
            (j.id[2:], *(getattr(j, c) for c in JOB_COLUMNS))
            for j in db.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id))
        ]
        attempts = [
            (a.job_id[2:], a.number, a.state, a.failure_class)
            for a in db.scalars(
                select(Attempt).where(Attempt.job_id.in_(ids)).order_by(Attempt.job_id)
            )
        ]
        events = list(
            db.scalars(select(Event).where(Event.job_id.in_(ids)).order_by(Event.id)).all()
        )
        moves = [  # in id order
            (e.job_id and e.job_id[2:], e.kind, e.from_state, e.to_state, e.message, e.detail, e.at)
            for e in events
        ]
    return [jobs, attempts, moves]


def test_transition_jobs_writes_what_transition_job_writes(
    sessions: sessionmaker[Session],
) -> None:
    one, many = _world(sessions, "a"), _world(sessions, "b")
    for ids in (one, many):
        with sessions.begin() as db:
            _admit(db, ids[0])
            _admit(db, ids[1])
    at = T0 + 10
    # one job at a time, as the loop used to
    with sessions.begin() as db:
        for job_id in one[:2]:
            job = get_job(db, job_id, for_update=True)
            job.attempt = 1
            transition_job(db, job_id, S.ADMITTED, job=job, at=at, message="admitted")
            sync_attempt(db, job)
        transition_job(db, one[2], S.CANCELLED, at=at, message="gone", detail={"by": "x"})
    with sessions.begin() as db:
        transition_job(db, one[0], S.STARTING, at=at + 1, message="launched")
        sync_attempt(db, get_job(db, one[0]))
        job = get_job(db, one[1])
        transition_job(
            db, one[1], S.FAILED, at=at + 1, message="bad", failure_class=FailureClass.USER_CODE
        )
        sync_attempt(db, job)
    # the same moves, set-based
    with sessions.begin() as db:
        found = job_states(db, many, for_update=True)
        assert found == dict.fromkeys(many, (S.PENDING, 0))
        transition_jobs(
            db,
            [
                StateChange(
                    job_id=many[0],
                    source=S.PENDING,
                    target=S.ADMITTED,
                    message="admitted",
                    attempt=1,
                    values={"attempt": 1},
                ),
                StateChange(
                    job_id=many[1],
                    source=S.PENDING,
                    target=S.ADMITTED,
                    message="admitted",
                    attempt=1,
                    values={"attempt": 1},
                ),
                StateChange(
                    job_id=many[2],
                    source=S.PENDING,
                    target=S.CANCELLED,
                    message="gone",
                    detail={"by": "x"},
                ),
            ],
            at=at,
        )
    with sessions.begin() as db:
        assert job_states(db, many[:2]) == {many[0]: (S.ADMITTED, 1), many[1]: (S.ADMITTED, 1)}
        transition_jobs(
            db,
            [
                StateChange(
                    job_id=many[0],
                    source=S.ADMITTED,
                    target=S.STARTING,
                    message="launched",
                    attempt=1,
                ),
                StateChange(
                    job_id=many[1],
                    source=S.ADMITTED,
                    target=S.FAILED,
                    message="bad",
                    failure=FailureClass.USER_CODE,
                    attempt=1,
                ),
            ],
            at=at + 1,
        )
    assert _rows(sessions, many) == _rows(sessions, one)


def test_transition_jobs_writes_nothing_when_one_move_is_illegal(
    sessions: sessionmaker[Session],
) -> None:
    ids = _world(sessions, "c")
    with sessions() as db:
        before = _rows(sessions, ids)
        with pytest.raises(IllegalTransition):
            transition_jobs(
                db,
                [
                    StateChange(job_id=ids[0], source=S.PENDING, target=S.CANCELLED, message="x"),
                    StateChange(job_id=ids[1], source=S.PENDING, target=S.RUNNING, message="x"),
                ],
                at=T0 + 5,
            )
        db.commit()
    assert _rows(sessions, ids) == before


def test_transition_jobs_expires_the_rows_the_session_holds(
    sessions: sessionmaker[Session],
) -> None:
    [job_id, *_] = _world(sessions, "d")
    with sessions.begin() as db:
        held = get_job(db, job_id)
        transition_jobs(
            db,
            [StateChange(job_id=job_id, source=S.PENDING, target=S.CANCELLED, message="x")],
            at=T0 + 5,
        )
        assert held.state == S.CANCELLED.value


def test_job_states_skips_unknown_jobs(sessions: sessionmaker[Session]) -> None:
    ids = _world(sessions, "e")
    with sessions.begin() as db:
        assert set(job_states(db, [*ids, "j-unknown"], for_update=True)) == set(ids)
        assert job_states(db, []) == {}
