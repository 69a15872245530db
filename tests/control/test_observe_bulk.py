"""``ControlLoop.observe`` writes its moves set-based (``control/observe.py``): the same
rows, the same events (in the same order for each job), the same moves, stops and
requeues as moving each job through ``transition_job`` did, on both stores. The
reference below is that one-job-at-a-time path."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.launch import replica_keys
from allotment.control.loop import ControlLoop
from allotment.control.writes import Move
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import ACTIVE, FailureClass, JobState
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import (
    Executor,
    GpuInfo,
    LaunchRequest,
    ReplicaKey,
    ReplicaPhase,
    ReplicaStatus,
)
from allotment.executors.failures import classify, describe_end
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.jobs import cancel_job, create_job, sync_attempt, transition_job
from allotment.store.models import Attempt, Event, Job
from allotment.store.views import open_attempts
from tests.store.conftest import POSTGRES_URL, _postgres_unreachable

S = JobState
P = ReplicaPhase
T0 = 1_700_000_000.0

CLUSTER = json.dumps(
    {
        "priority_classes": [{"name": "normal", "value": 10}],
        "pools": [{"name": "p"}],
        "nodes": [{"name": "n-0", "pool": "p", "capacity": {"gpu": 32, "cpu": 64}}],
        "queues": [
            {
                "name": "q",
                "quota": {"p": {"gpu": 32}},
                "default_priority_class": "normal",
                "retry": {"max_attempts": 3, "on": ["user_code"], "backoff": "5s"},
            },
        ],
    }
)

JOBS = {  # name: (queue, replicas)
    "runs": ("q", 1),
    "quick": ("q", 1),
    "retried": ("q", 1),
    "fails": ("q", 1),
    "gang": ("q", 2),
    "preempted": ("q", 1),
    "cancel-live": ("q", 1),
    "cancel-done": ("q", 1),
    "zombie": ("q", 1),
    "later": ("q", 1),
    "lost": ("q", 2),
}


class Scripted(Executor):
    """Starts nothing; reports what the test sets in :attr:`statuses`."""

    def __init__(self) -> None:
        self.statuses: dict[ReplicaKey, ReplicaStatus] = {}
        self.stops: list[ReplicaKey] = []

    def launch(self, request: LaunchRequest) -> str:
        return f"{request.job_id}/{request.replica}-{request.index}"

    def stop(self, key: ReplicaKey, grace_s: float) -> None:
        self.stops.append(key)

    def observe(self) -> dict[ReplicaKey, ReplicaStatus]:
        return dict(self.statuses)

    def inventory(self) -> list[GpuInfo]:
        return []


@pytest.fixture(params=["sqlite", "postgresql"])
def two_stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[sessionmaker[Session], sessionmaker[Session]]]:
    """Two empty migrated stores of one kind."""
    if request.param == "sqlite":
        engines = [make_engine(f"sqlite:///{tmp_path / f'{n}.db'}") for n in ("a", "b")]
        for engine in engines:
            migrate.upgrade(engine)
        yield session_factory(engines[0]), session_factory(engines[1])
        for engine in engines:
            engine.dispose()
        return
    why = _postgres_unreachable()
    if why:
        pytest.skip(why)
    schemas = [f"allot_test_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    admin = make_engine(POSTGRES_URL)
    with admin.begin() as connection:
        for schema in schemas:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    engines = [
        make_engine(POSTGRES_URL, connect_args={"options": f"-c search_path={schema}"})
        for schema in schemas
    ]
    try:
        for engine in engines:
            migrate.upgrade(engine)
        yield session_factory(engines[0]), session_factory(engines[1])
    finally:
        for engine in engines:
            engine.dispose()
        with admin.begin() as connection:
            for schema in schemas:
                connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _world(sessions: sessionmaker[Session], work: Path) -> tuple[ControlLoop, Clock]:
    """Every job of :data:`JOBS` admitted and launched (``starting``); then ``preempted``
    is preempted and both ``cancel-*`` cancelled, as the cycle and the API do."""
    clock = Clock()
    cluster = load_cluster_text(CLUSTER, source="test")
    with sessions.begin() as db:
        for i, (name, (queue, replicas)) in enumerate(JOBS.items()):
            spec = JobSpec.model_validate(
                {
                    "name": name,
                    "queue": queue,
                    "replicas": [{"count": replicas, "resources": {"gpu": 1, "cpu": 1}}],
                    "command": ["true"],
                }
            )
            create_job(
                db,
                spec,
                tenant="t",
                user="u",
                at=T0 - 100 + i,
                job_id=name,
                accepted="ok",
                priority_class="normal",
            )
    loop = ControlLoop(cluster, sessions, Scripted(), work_root=work, clock=clock)
    loop.cycle()
    clock.now += 1
    with sessions.begin() as db:
        job = transition_job(
            db,
            "preempted",
            S.PREEMPTED,
            at=clock.now,
            message="preempted",
            detail={"cause": "reclaim", "preemptor": "x"},
        )
        sync_attempt(db, job)
        cancel_job(db, "cancel-live", at=clock.now, by="u")
        cancel_job(db, "cancel-done", at=clock.now, by="u")
    loop.session.stopping("preempted")
    return loop, clock


def _status(phase: ReplicaPhase, **kw: Any) -> ReplicaStatus:
    started = kw.pop("started_at", T0)
    return ReplicaStatus(phase=phase, started_at=started, **kw)


def _turns(clock: Clock) -> list[dict[ReplicaKey, ReplicaStatus]]:
    """What the executor reports on three turns."""

    def key(job: str, index: int = 0) -> ReplicaKey:
        return ReplicaKey(job, 1, "worker", index)

    run = _status(P.RUNNING)
    ok = _status(P.EXITED, exit_code=0, ended_at=T0 + 2)
    bad = _status(P.EXITED, exit_code=1, ended_at=T0 + 3)
    killed = _status(P.KILLED, signal=15, ended_at=T0 + 4, stop_requested=True)
    first = {
        key("runs"): _status(P.STARTING, started_at=None),
        key("quick"): ok,
        key("retried"): bad,
        key("fails"): _status(P.KILLED, signal=9, ended_at=T0 + 1),
        key("gang", 0): bad,
        key("gang", 1): run,
        key("preempted"): killed,
        key("cancel-live"): run,
        key("cancel-done"): ok,
        key("later"): run,
        key("lost", 0): _status(P.LOST, lingering=True),
        key("lost", 1): run,
    }
    second = {
        **first,
        key("runs"): run,
        key("gang", 1): killed,
        key("later"): ok,
        key("lost", 1): killed,
    }
    third = {
        **second,
        key("cancel-live"): killed,
        key("lost", 0): _status(P.LOST),
        key("runs"): bad,
    }
    return [first, second, third]


def _reference_observe(loop: ControlLoop) -> list[Move]:
    """``observe`` as it was: one job at a time through the ORM, ``transition_job`` and
    ``sync_attempt`` per move, ``finish_attempt`` per closed attempt."""
    loop.refresh_nodes()
    statuses = loop.executor.observe()
    session = loop.session
    now = loop.clock()
    moves: list[Move] = []
    to_stop: list[ReplicaKey] = []
    stopping: list[str] = []
    gone: list[str] = []
    requeued: list[Any] = []
    with loop.store_sessions.begin() as db:
        for job, attempt in open_attempts(db, lock=True):
            state = S(job.state)
            if state is S.ADMITTED:
                continue
            keys = replica_keys(job.id, attempt.number, attempt.allocation)
            seen = {key: statuses.get(key) for key in keys}
            if state in (S.STARTING, S.RUNNING):
                known = {k: s for k, s in seen.items() if s is not None}
                if len(known) < len(keys):
                    continue
                state = _reference_apply(loop, db, job, attempt, known, now, moves, to_stop)
                if state is S.FAILED:
                    loop._stop_sent.add(job.id)
            if state in ACTIVE:
                continue
            ended = {k: s for k, s in seen.items() if s is not None}
            if all(s.ended for s in ended.values()):
                loop._finish(db, job, attempt, ended, now, moves, requeued)
                gone.append(job.id)
            elif job.id not in loop._stop_sent:
                to_stop.extend(k for k, s in ended.items() if not s.ended)
                stopping.append(job.id)
            else:
                to_stop.extend(k for k, s in ended.items() if s.lingering)
    for job_id in stopping:
        loop._stop_sent.add(job_id)
        session.stopping(job_id)
    loop._settle(session, gone, requeued)
    loop._stop_keys(list(dict.fromkeys(to_stop)))
    return moves


def _reference_apply(
    loop: ControlLoop,
    db: Session,
    job: Job,
    attempt: Attempt,
    seen: Mapping[ReplicaKey, ReplicaStatus],
    now: float,
    moves: list[Move],
    to_stop: list[ReplicaKey],
) -> JobState:
    state = S(job.state)
    started = all(
        s.phase is P.RUNNING or (s.ended and s.started_at is not None) for s in seen.values()
    )
    if state is S.STARTING and started:
        state = loop._move(db, job, S.RUNNING, now, "all replicas running", moves)
        attempt.start_time = min(
            (s.started_at for s in seen.values() if s.started_at is not None), default=now
        )
    failures: list[tuple[float, ReplicaKey, ReplicaStatus, FailureClass]] = []
    for key, status in seen.items():
        if status.over:
            klass = classify(status)
            if klass is not None:
                failures.append((status.ended_at or now, key, status, klass))
    if failures:
        _, key, status, klass = min(failures, key=lambda f: (f[0], f[1]))
        state = loop._move(
            db,
            job,
            S.FAILED,
            now,
            f"replica {key.replica}-{key.index} ended: {describe_end(status)}",
            moves,
            failure=klass,
            detail={"replica": f"{key.replica}-{key.index}", "phase": status.phase.value},
        )
        attempt.exit_code = status.exit_code
        attempt.signal = status.signal
        to_stop.extend(k for k, s in seen.items() if not s.ended)
    elif all(s.ended for s in seen.values()):
        state = loop._move(db, job, S.SUCCEEDED, now, "all replicas exited 0", moves)
        attempt.exit_code = 0
    return state


def _rows(sessions: sessionmaker[Session]) -> list[Any]:
    """Every column of the jobs and attempts, and each job's events in id order."""
    with sessions() as db:
        jobs = [
            tuple(getattr(j, c.key) for c in Job.__table__.columns)
            for j in db.scalars(select(Job).order_by(Job.id))
        ]
        attempts = [
            tuple(getattr(a, c.key) for c in Attempt.__table__.columns)
            for a in db.scalars(select(Attempt).order_by(Attempt.job_id, Attempt.number))
        ]
        events: dict[str | None, list[Any]] = {}
        for e in db.scalars(select(Event).order_by(Event.id)):
            events.setdefault(e.job_id, []).append(
                (e.kind, e.from_state, e.to_state, e.message, e.detail, e.at)
            )
    return [jobs, attempts, sorted(events.items(), key=lambda kv: str(kv[0]))]


def _view(loop: ControlLoop) -> Any:
    executor = loop.executor
    assert isinstance(executor, Scripted)
    session = loop.session
    return (
        executor.stops,
        sorted(loop._stop_sent),
        sorted(job.id for job in session.pending()),
        sorted(session.running),
    )


def test_observe_writes_what_moving_one_job_at_a_time_wrote(
    two_stores: tuple[sessionmaker[Session], sessionmaker[Session]], tmp_path: Path
) -> None:
    bulk, one = two_stores
    new_loop, new_clock = _world(bulk, tmp_path / "a")
    old_loop, old_clock = _world(one, tmp_path / "b")
    assert _rows(bulk) == _rows(one)
    for statuses in _turns(new_clock):
        for loop, clock in ((new_loop, new_clock), (old_loop, old_clock)):
            clock.now += 10
            executor = loop.executor
            assert isinstance(executor, Scripted)
            executor.statuses = statuses
        new_moves = new_loop.observe()
        old_moves = _reference_observe(old_loop)
        assert new_moves == old_moves
        assert new_moves  # every turn moves something
        assert _rows(bulk) == _rows(one)
        assert _view(new_loop) == _view(old_loop)
    rows = _rows(bulk)
    states = {job[0]: job[Job.__table__.columns.keys().index("state")] for job in rows[0]}
    assert states == {
        "runs": "pending",  # running, then failed on the third turn: retried
        "quick": "succeeded",  # starting → running → succeeded in one turn
        "retried": "pending",  # starting → running → failed → pending in one turn
        "fails": "pending",  # killed by a signal: user_code, retried
        "gang": "pending",  # failed, its other replica stopped, closed a turn later
        "preempted": "pending",  # requeued once its replica ended
        "cancel-live": "cancelled",
        "cancel-done": "cancelled",
        "zombie": "starting",  # left to reconcile
        "later": "succeeded",
        "lost": "failed",  # node_failure is not retried here
    }
