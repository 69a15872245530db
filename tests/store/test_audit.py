"""The audit chain on SQLite and PostgreSQL: appends link, concurrent appends never fork,
and any edited, deleted or reordered record is named by ``verify_chain``."""

from __future__ import annotations

import itertools
import threading

from sqlalchemy import delete, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from allotment.store import audit
from allotment.store.models import AuditRecord


def add(sessions: sessionmaker[Session], n: int, *, user: str = "ada", start: float = 0.0) -> None:
    for i in range(n):
        with sessions.begin() as db:
            audit.append(
                db,
                at=start + i,
                user=user,
                tenant="vision" if i % 2 else None,
                action="job.submit",
                object=f"j-{i}",
                source="127.0.0.1",
                result="ok",
                detail={"status": 201, "n": i, "nested": {"b": [1, 2.5], "a": None}},
            )


def check(sessions: sessionmaker[Session]) -> tuple[int, str] | None:
    with sessions() as db:
        return audit.verify_chain(db)


def test_appends_form_a_chain(sessions: sessionmaker[Session]) -> None:
    add(sessions, 5)
    with sessions() as db:
        rows = list(db.scalars(select(AuditRecord).order_by(AuditRecord.id)))
        verdict = audit.verify(db)
    assert [r.id for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0].prev_hash == audit.GENESIS
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(rows))
    assert verdict.first_bad is None and verdict.checked == 5
    assert verdict.head_hash == rows[-1].hash


def test_empty_chain_is_intact(sessions: sessionmaker[Session]) -> None:
    with sessions() as db:
        verdict = audit.verify(db)
    assert verdict.first_bad is None and verdict.checked == 0


def test_filters(sessions: sessionmaker[Session]) -> None:
    add(sessions, 6)
    add(sessions, 2, user="bob", start=100)
    with sessions() as db:
        assert [r.id for r in audit.list_records(db, user="bob")] == [7, 8]
        assert [r.id for r in audit.list_records(db, tenant="vision")] == [2, 4, 6, 8]
        assert [r.id for r in audit.list_records(db, since=2, until=4)] == [3, 4]
        assert [r.id for r in audit.list_records(db, object="j-1")] == [2, 8]
        assert [r.id for r in audit.list_records(db, after=5, limit=2)] == [6, 7]
        assert audit.list_records(db, action="job.cancel") == []


def test_edited_record_is_named(sessions: sessionmaker[Session]) -> None:
    add(sessions, 5)
    with sessions.begin() as db:
        db.execute(update(AuditRecord).where(AuditRecord.id == 3).values(user="mallory"))
    bad = check(sessions)
    assert bad is not None and bad[0] == 3 and "changed" in bad[1]


def test_edited_detail_is_named(sessions: sessionmaker[Session]) -> None:
    add(sessions, 3)
    with sessions.begin() as db:
        db.execute(update(AuditRecord).where(AuditRecord.id == 2).values(detail={"status": 200}))
    assert check(sessions) == (2, "contents changed since it was written (hash mismatch)")


def test_rehashed_edit_breaks_the_next_link(sessions: sessionmaker[Session]) -> None:
    add(sessions, 4)
    with sessions.begin() as db:
        row = db.get(AuditRecord, 2)
        assert row is not None
        row.result = "ok-forged"
        row.hash = audit.record_hash(row)
    bad = check(sessions)
    assert bad is not None and bad[0] == 3 and "prev_hash" in bad[1]


def test_deleted_record_is_named(sessions: sessionmaker[Session]) -> None:
    add(sessions, 5)
    with sessions.begin() as db:
        db.execute(delete(AuditRecord).where(AuditRecord.id == 3))
    assert check(sessions) == (4, "record 3 missing before it (deleted)")


def test_deleted_first_record_is_named(sessions: sessionmaker[Session]) -> None:
    add(sessions, 3)
    with sessions.begin() as db:
        db.execute(delete(AuditRecord).where(AuditRecord.id == 1))
    bad = check(sessions)
    assert bad is not None and bad[0] == 2


def test_swapped_records_are_named(sessions: sessionmaker[Session]) -> None:
    add(sessions, 5)
    with sessions.begin() as db:
        db.execute(update(AuditRecord).where(AuditRecord.id == 2).values(id=-2))
        db.execute(update(AuditRecord).where(AuditRecord.id == 3).values(id=2))
        db.execute(update(AuditRecord).where(AuditRecord.id == -2).values(id=3))
    bad = check(sessions)
    assert bad is not None and bad[0] == 2 and "prev_hash" in bad[1]


def test_swapped_timestamps_are_named(sessions: sessionmaker[Session]) -> None:
    add(sessions, 4)
    with sessions.begin() as db:
        db.execute(text("UPDATE audit_records SET at = 99 WHERE id = 4"))
    assert check(sessions) == (4, "contents changed since it was written (hash mismatch)")


def test_concurrent_appends_never_fork(sessions: sessionmaker[Session]) -> None:
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            add(sessions, 10, user=name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"u{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with sessions() as db:
        ids = list(db.scalars(select(AuditRecord.id).order_by(AuditRecord.id)))
        verdict = audit.verify(db)
    assert ids == list(range(1, 41))
    assert verdict.first_bad is None and verdict.checked == 40


def _one(db: Session, i: int) -> AuditRecord:
    return audit.append(
        db,
        at=float(i),
        user="ada",
        tenant=None,
        action="a",
        object=f"o{i}",
        source="s",
        result="ok",
    )


def test_appends_in_one_transaction_chain_and_a_new_transaction_reads_the_head(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as db:  # a group of requests' writes: the head is read once
        records = [_one(db, i) for i in range(3)]
        assert [r.id for r in records] == [1, 2, 3]
        assert records[0] in db and records[0].hash == audit.record_hash(records[0])
    db = sessions()
    with db.begin():
        _one(db, 3)
    with sessions.begin() as other:  # another session moves the head meanwhile
        _one(other, 4)
    with db.begin():  # the same session, a new transaction: its head is read again
        assert _one(db, 5).id == 6
    db.close()
    assert check(sessions) is None
    with sessions() as reader:
        assert audit.verify(reader).checked == 6


def test_a_rolled_back_savepoint_forgets_the_head_it_wrote(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as db:
        _one(db, 0)
        nested = db.begin_nested()
        _one(db, 1)
        nested.rollback()
        assert _one(db, 2).id == 2
    with sessions() as reader:
        verdict = audit.verify(reader)
    assert verdict.first_bad is None and verdict.checked == 2
