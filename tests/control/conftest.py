"""Control loop fixtures: a real SQLite store, the real local executor, real processes
(every one of them killed in teardown)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.loop import ControlLoop
from allotment.domain.cluster import Cluster
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster
from allotment.executors.base import ReplicaKey
from allotment.executors.local import LocalExecutor
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.jobs import TRANSITION, create_job, events_for, get_job, transition_job
from allotment.store.models import Attempt
from tests.executors.processes import kill_everything

PY = sys.executable
CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "cluster-local.yaml"


@pytest.fixture
def cluster() -> Cluster:
    return load_cluster(CLUSTER)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def state_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "state"
    yield root
    kill_everything(root)


MakeLoop = Callable[[], ControlLoop]


@pytest.fixture
def make_loop(
    cluster: Cluster, sessions: sessionmaker[Session], state_root: Path, tmp_path: Path
) -> Iterator[MakeLoop]:
    """A new loop (and a new executor) on the same store and state root each call."""
    executors: list[LocalExecutor] = []

    def make() -> ControlLoop:
        executor = LocalExecutor(state_root)
        executors.append(executor)
        return ControlLoop(
            cluster,
            sessions,
            executor,
            work_root=tmp_path / "work",
            clock=time.time,
            stop_grace_s=1.0,
        )

    yield make
    kill_everything(state_root)
    for executor in executors:
        for child in executor._children.values():
            with contextlib.suppress(Exception):
                child.wait(timeout=5)


Submit = Callable[..., str]


@pytest.fixture
def submit(sessions: sessionmaker[Session]) -> Submit:
    """Submit a job as the API will: create it, then move it to pending."""

    def submit(
        code: str,
        *,
        queue: str = "default",
        replicas: int = 1,
        fields: dict[str, Any] | None = None,
        **res: Any,
    ) -> str:
        """``fields`` go into the job spec as written (``retry``, ``max_runtime``,
        ``command`` instead of ``python -c code``)."""
        resources = {"gpu": 1, "cpu": 1, "memory": "1Gi", **res}
        spec = JobSpec.model_validate(
            {
                "name": "t",
                "queue": queue,
                "replicas": [{"count": replicas, "resources": resources}],
                "command": [PY, "-c", code],
                **(fields or {}),
            }
        )
        now = time.time()
        with sessions.begin() as db:
            job = create_job(db, spec, tenant="me", user="me", at=now, priority_class="training")
            transition_job(db, job.id, JobState.PENDING, at=now, message="accepted")
            return job.id

    return submit


def transitions(sessions: sessionmaker[Session], job_id: str) -> list[str]:
    with sessions() as db:
        return [e.to_state or "" for e in events_for(db, job_id) if e.kind == TRANSITION]


def attempts(sessions: sessionmaker[Session], job_id: str) -> list[Attempt]:
    with sessions() as db:
        query = select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
        return list(db.scalars(query).all())


def key_of(job_id: str, index: int = 0, attempt: int = 1) -> ReplicaKey:
    return ReplicaKey(job_id, attempt, "worker", index)


def executor_of(loop: ControlLoop) -> LocalExecutor:
    executor = loop.executor
    assert isinstance(executor, LocalExecutor)
    return executor


def state_of(sessions: sessionmaker[Session], job_id: str) -> JobState:
    with sessions() as db:
        return JobState(get_job(db, job_id).state)


def loop_until(
    loop: ControlLoop,
    done: Callable[[], bool],
    what: str,
    timeout: float = 10.0,
) -> None:
    """Observe and cycle until ``done()``; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loop.observe()
        loop.cycle()
        if done():
            return
        time.sleep(0.05)
    raise AssertionError(f"not reached within {timeout}s: {what}")


def wait_until(done: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``done()`` (nothing else) until it holds; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what}")
        time.sleep(0.02)


def run_until(
    loop: ControlLoop,
    sessions: sessionmaker[Session],
    job_id: str,
    states: set[JobState],
    timeout: float = 10.0,
) -> JobState:
    """Observe (and cycle) until the job reaches one of ``states``."""
    deadline = time.monotonic() + timeout
    state = state_of(sessions, job_id)
    while time.monotonic() < deadline:
        loop.observe()
        loop.cycle()
        state = state_of(sessions, job_id)
        if state in states:
            return state
        time.sleep(0.05)
    raise AssertionError(f"{job_id} did not reach {states}; last state {state}")
