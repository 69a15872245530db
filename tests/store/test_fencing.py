"""Fencing on both stores: each new leader raises the term, and a deposed leader's
transactions fail before they read or write anything, so it can never admit, launch or
free a GPU once another server leads (the split brain that double-booked devices)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from tests.executors.processes import kill_everything

from allotment.control.loop import ControlLoop
from allotment.control.runner import LoopRunner
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster
from allotment.executors.local import LocalExecutor
from allotment.store.db import session_factory
from allotment.store.fencing import Fenced, current_term, fence, take_term
from allotment.store.jobs import create_job, get_job, transition_job
from allotment.store.models import Attempt, Job

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "cluster-local.yaml"


def test_fault_each_leader_raises_the_term(sessions: sessionmaker[Session]) -> None:
    assert current_term(sessions) is None
    assert take_term(sessions, holder="a", at=1.0) == 1
    assert take_term(sessions, holder="b", at=2.0) == 2
    assert current_term(sessions) == 2


def test_fault_a_deposed_leaders_transactions_are_refused(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    old = fence(session_factory(engine), take_term(sessions, holder="old", at=1.0))
    with old.begin() as db:
        db.scalar(select(Job.id))
    new = fence(session_factory(engine), take_term(sessions, holder="new", at=2.0))
    with pytest.raises(Fenced, match="term 1 is over"), old.begin() as db:
        db.scalar(select(Job.id))
    with new.begin() as db:
        db.scalar(select(Job.id))


def _loop(cluster_sessions: sessionmaker[Session], root: Path) -> ControlLoop:
    return ControlLoop(
        load_cluster(CLUSTER),
        cluster_sessions,
        LocalExecutor(root / "state"),
        work_root=root / "work",
        clock=time.time,
        stop_grace_s=1.0,
    )


def _submit(sessions: sessionmaker[Session]) -> str:
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "queue": "default",
            "replicas": [{"count": 1, "resources": {"gpu": 1}}],
            "command": ["true"],
        }
    )
    with sessions.begin() as db:
        job = create_job(
            db, spec, tenant="me", user="me", at=time.time(), priority_class="training"
        )
        transition_job(db, job.id, JobState.PENDING, at=time.time(), message="accepted")
        return job.id


def test_fault_a_deposed_leader_admits_nothing_and_its_runner_stops(
    engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    old_term = take_term(sessions, holder="old", at=1.0)
    old = _loop(fence(session_factory(engine), old_term), tmp_path)
    old.cycle()  # the old leader works while it holds the term
    job_id = _submit(sessions)
    take_term(sessions, holder="new", at=2.0)  # another server took over
    try:
        with pytest.raises(Fenced):
            old.observe()
        with pytest.raises(Fenced):
            old.cycle()
        with sessions() as db:
            assert get_job(db, job_id).state == JobState.PENDING.value
            assert db.scalar(select(Attempt).where(Attempt.job_id == job_id)) is None
        runner = LoopRunner(old, tick_s=0.05)
        runner.start()
        deadline = time.monotonic() + 10
        while runner.alive and time.monotonic() < deadline:
            time.sleep(0.02)
        assert runner.fenced and not runner.alive
        assert "another server leads now" in (runner.last_error or "")
        with sessions() as db:
            assert get_job(db, job_id).state == JobState.PENDING.value
    finally:
        kill_everything(tmp_path / "state")


def test_fault_a_new_term_waits_for_the_old_leaders_transaction_in_flight(
    engine: Engine, sessions: sessionmaker[Session]
) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite serialises writers itself")
    old = fence(session_factory(engine), take_term(sessions, holder="old", at=1.0))
    taken: list[int] = []
    with old.begin() as db:
        db.scalar(select(Job.id))  # the proof holds the term's row while this runs
        thread = threading.Thread(
            target=lambda: taken.append(take_term(sessions, holder="new", at=2.0))
        )
        thread.start()
        thread.join(0.5)
        assert taken == []  # the new leader waits for the old decision to end
    thread.join(10)
    assert taken == [2]
