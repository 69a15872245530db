"""The control loop reads only what changed since its last turn, on both stores, and
loses no job: a job submitted or cancelled between turns joins or leaves its line; a job
whose events committed after higher ids were read ("late", as PostgreSQL allows) joins at
the next turn while its ids are remembered as gaps, and at the latest at the safety
resync; a restarted loop starts from the whole store."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.loop import ControlLoop
from allotment.control.pending import PendingFeed
from allotment.domain.job import JobSpec
from allotment.domain.loading import load_cluster
from allotment.executors.timed import TimedExecutor
from allotment.store.jobs import cancel_job, create_job
from allotment.store.models import Event
from allotment.store.views import last_event_id

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "cluster-local.yaml"
T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _loop(sessions: sessionmaker[Session], tmp_path: Path, clock: Clock) -> ControlLoop:
    return ControlLoop(
        load_cluster(CLUSTER),
        sessions,
        TimedExecutor(clock=clock),
        work_root=tmp_path / "work",
        clock=clock,
    )


SPEC = JobSpec.model_validate(
    {
        "name": "t",
        "queue": "default",
        # more than the fleet has: it waits in its line, where the tests look for it
        "replicas": [{"count": 1, "resources": {"gpu": 4}}],
        "command": ["true"],
    }
)


def _create(db: Session, at: float) -> str:
    return create_job(
        db, SPEC, tenant="me", user="me", at=at, priority_class="training", accepted="accepted"
    ).id


def _submit(sessions: sessionmaker[Session], at: float = T0) -> str:
    with sessions.begin() as db:
        return _create(db, at)


def _waits(loop: ControlLoop, job_id: str) -> bool:
    return loop.session.pending_job(job_id) is not None


def _leave_gap(sessions: sessionmaker[Session], engine: Engine, size: int) -> list[int]:
    """Ids just above the newest event that no writer will take: the next events get
    higher ones. Returns them."""
    with sessions.begin() as db:
        top = last_event_id(db) + size + 1
        if engine.dialect.name == "postgresql":
            db.execute(
                text("SELECT setval(pg_get_serial_sequence('events', 'id'), :v)"), {"v": top}
            )
        db.add(Event(id=top, job_id=None, at=T0, kind="notice", message="gap", detail={}))
    return list(range(top - size, top))


def _submit_late(sessions: sessionmaker[Session], ids: list[int], at: float) -> str:
    """Submit a job whose two events carry ``ids``: as if its transaction had taken them
    before other writers took higher ones, and committed after those were read."""
    with sessions.begin() as db:
        job_id = _create(db, at)
        events = db.scalars(select(Event.id).where(Event.job_id == job_id).order_by(Event.id))
        for old, new in zip(list(events), ids, strict=False):
            db.execute(update(Event).where(Event.id == old).values(id=new))
    return job_id


def test_a_job_submitted_between_turns_joins_without_a_full_read(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    clock = Clock()
    loop = _loop(sessions, tmp_path, clock)
    first = _submit(sessions)
    loop.cycle()
    assert _waits(loop, first)
    clock.now += 1
    second = _submit(sessions, clock.now)
    loop.cycle()
    assert _waits(loop, first) and _waits(loop, second)
    assert loop.pending_feed.full_reads == 0
    assert loop.pending_feed.incremental_reads == 2


def test_a_job_cancelled_between_turns_leaves_its_line(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    clock = Clock()
    loop = _loop(sessions, tmp_path, clock)
    kept, cancelled = _submit(sessions), _submit(sessions)
    loop.cycle()
    assert _waits(loop, kept) and _waits(loop, cancelled)
    with sessions.begin() as db:
        cancel_job(db, cancelled, at=T0 + 1)
    clock.now += 1
    loop.cycle()
    assert _waits(loop, kept) and not _waits(loop, cancelled)
    assert loop.pending_feed.full_reads == 0


def test_a_late_commit_joins_at_the_next_turn(
    engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    clock = Clock()
    loop = _loop(sessions, tmp_path, clock)
    loop.cycle()
    gap = _leave_gap(sessions, engine, 5)
    early = _submit(sessions)  # its ids are above the gap
    clock.now += 1
    loop.cycle()
    assert _waits(loop, early)
    assert set(gap) <= set(loop.pending_feed.gaps)
    late = _submit_late(sessions, gap[:2], clock.now)
    clock.now += 1
    loop.cycle()
    assert _waits(loop, late)
    assert loop.pending_feed.full_reads == 0
    assert not set(gap[:2]) & set(loop.pending_feed.gaps)


def test_a_late_commit_after_its_gap_was_given_up_joins_at_the_safety_resync(
    engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    clock = Clock()
    loop = _loop(sessions, tmp_path, clock)
    loop.pending_feed = PendingFeed(resync_s=60.0, gap_keep_s=5.0)
    loop.cycle()  # the session is built: the next full read is due at T0 + 60
    gap = _leave_gap(sessions, engine, 5)
    clock.now = T0 + 1
    loop.cycle()
    assert set(gap) <= set(loop.pending_feed.gaps)
    clock.now = T0 + 10
    loop.cycle()
    assert not loop.pending_feed.gaps  # given up
    late = _submit_late(sessions, gap[:2], clock.now)
    clock.now = T0 + 11
    loop.cycle()
    # Not seen by the incremental read (its ids lie below the mark, no longer gaps):
    # this is the case the periodic full read is there for.
    assert not _waits(loop, late) and loop.pending_feed.full_reads == 0
    clock.now = T0 + 61
    loop.cycle()
    assert _waits(loop, late)
    assert loop.pending_feed.full_reads == 1


def test_after_a_restart_nothing_is_lost(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    clock = Clock()
    loop = _loop(sessions, tmp_path, clock)
    kept, cancelled = _submit(sessions), _submit(sessions)
    loop.cycle()
    # while no loop runs: one more job, one cancelled
    submitted = _submit(sessions, T0 + 1)
    with sessions.begin() as db:
        cancel_job(db, cancelled, at=T0 + 1)
    clock.now += 2
    again = _loop(sessions, tmp_path, clock)
    again.cycle()
    assert _waits(again, kept) and _waits(again, submitted)
    assert not _waits(again, cancelled)
    later = _submit(sessions, clock.now)
    clock.now += 1
    again.cycle()
    assert _waits(again, later) and again.pending_feed.full_reads == 0


def test_concurrent_writers_commit_out_of_id_order_and_no_job_is_lost(
    engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """PostgreSQL takes an id when a row is inserted: a transaction still open holds
    lower ids than one committed after it. (SQLite serialises writers: a second one
    would wait for the first, so ids there are always committed in order.)"""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite serialises writers: no id commits out of order")
    clock = Clock()
    loop = _loop(sessions, tmp_path, clock)
    loop.cycle()
    with sessions() as slow:
        late = _create(slow, T0)
        slow.flush()  # its events hold their ids, uncommitted
        early = _submit(sessions)
        clock.now += 1
        loop.cycle()
        assert _waits(loop, early) and not _waits(loop, late)
        slow.commit()
    clock.now += 1
    loop.cycle()
    assert _waits(loop, late)
    # a restart while a writer is in flight: its ids are below the restart's mark
    with sessions() as slow:
        in_flight = _create(slow, T0)
        slow.flush()
        restarted = _loop(sessions, tmp_path, clock)
        restarted.cycle()
        assert not _waits(restarted, in_flight)
        slow.commit()
    clock.now += 1
    restarted.cycle()
    assert _waits(restarted, in_flight) and _waits(restarted, late)
    assert loop.pending_feed.full_reads == restarted.pending_feed.full_reads == 0
