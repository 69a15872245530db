"""Group commit on a real store: concurrent writers share transactions, each gets its
own result once committed, and one bad write fails only its own caller."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from allotment.store import audit, migrate
from allotment.store.batching import GroupCommit
from allotment.store.db import make_engine, session_factory
from allotment.store.models import AuditRecord

WRITERS = 24


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate.upgrade(engine)
    yield session_factory(engine)
    engine.dispose()


def _record(db: Session, n: int) -> int:
    row = audit.append(
        db, at=float(n), user=f"u{n}", tenant=None, action="test", object=str(n),
        source="test", result="ok",
    )  # fmt: skip
    return row.id


@pytest.mark.parametrize("max_group", [256, 5])
def test_concurrent_writers_share_transactions_and_each_gets_its_own_result(
    sessions: sessionmaker[Session], max_group: int
) -> None:
    writes = GroupCommit(sessions, max_group=max_group)
    # The first writer holds its group open until every other one waits behind it.
    held = threading.Event()
    results: dict[int, int] = {}

    def first(db: Session) -> int:
        held.wait(10)
        return _record(db, 0)

    def writer(n: int) -> None:
        if n == 0:
            results[n] = writes.run(first)
        else:
            results[n] = writes.run(lambda db: _record(db, n))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    threads[0].start()
    while not writes._writing:
        threading.Event().wait(0.01)
    for t in threads[1:]:
        t.start()
    while len(writes._waiting) < WRITERS - 1:  # everyone else queued behind the first
        threading.Event().wait(0.01)
    held.set()
    for t in threads:
        t.join(10)
    assert sorted(results) == list(range(WRITERS))
    # The first alone, then the rest in groups of at most max_group.
    assert writes.writes == WRITERS and writes.groups == 1 + math.ceil((WRITERS - 1) / max_group)
    with sessions() as db:
        rows = {r.user: r.id for r in db.scalars(select(AuditRecord))}
        assert {f"u{n}": results[n] for n in range(WRITERS)} == rows
    with sessions() as db:
        verdict = audit.verify(db)  # the chain holds across grouped appends
        assert verdict.first_bad is None and verdict.checked == WRITERS


def test_one_bad_write_fails_alone_and_the_others_of_its_group_commit(
    sessions: sessionmaker[Session],
) -> None:
    writes = GroupCommit(sessions)
    held = threading.Event()
    errors: list[BaseException] = []
    done: list[int] = []

    def slow(db: Session) -> int:
        held.wait(10)
        return _record(db, 100)

    def bad(db: Session) -> int:
        _record(db, 200)
        db.execute(text("INSERT INTO no_such_table VALUES (1)"))
        return 0

    def run(work: object) -> None:
        try:
            done.append(writes.run(work))  # type: ignore[arg-type]
        except Exception as exc:
            errors.append(exc)

    first = threading.Thread(target=run, args=(slow,))
    first.start()
    while not writes._writing:
        threading.Event().wait(0.01)
    others = [threading.Thread(target=run, args=(bad,))] + [
        threading.Thread(target=run, args=(lambda db, n=n: _record(db, n),)) for n in range(3)
    ]
    for t in others:
        t.start()
    while len(writes._waiting) < len(others):
        threading.Event().wait(0.01)
    held.set()
    for t in [first, *others]:
        t.join(10)
    assert len(errors) == 1 and "no_such_table" in str(errors[0])
    assert len(done) == 4
    with sessions() as db:
        users = set(db.scalars(select(AuditRecord.user)))
        assert users == {"u100", "u0", "u1", "u2"}  # the bad write left nothing
        assert db.scalar(select(func.count()).select_from(AuditRecord)) == 4
