"""The audit trail: an append-only, hash-chained table of API calls.

Each record's ``hash`` is the SHA-256 of its canonical JSON (:func:`record_hash`: id,
time, user, tenant, action, object, source, result, detail and ``prev_hash``), and its
``prev_hash`` is the previous record's ``hash`` (:data:`GENESIS` for the first). Ids are
consecutive from 1. Editing a record breaks its own hash; deleting one leaves a gap in
the ids and breaks the next record's ``prev_hash``; swapping two breaks both hashes.
:func:`verify_chain` names the first record where any of that shows.

Appends are serialised so that concurrent writers never fork the chain: on PostgreSQL by
a transaction-level advisory lock, on SQLite by taking the database's write lock before
the head is read. What no chain can show on its own is the removal of the newest
records; compare ``verify_chain``'s head hash with one kept elsewhere for that.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select, text, update
from sqlalchemy.orm import Session, make_transient_to_detached

from allotment.store.models import AuditRecord, Base

SYSTEM_USER = "allotment"
"""Who the audit trail names for what the platform does by itself."""
SYSTEM_SOURCE = "control-loop"
"""The source of those records."""
GENESIS = "0" * 64
"""The ``prev_hash`` of the first record."""

CHAIN_LOCK_KEY = 0x616C6C6F74617564  # b"allotaud"
"""The PostgreSQL advisory lock key that serialises appends."""

VERIFY_BATCH = 1000


def canonical(fields: dict[str, Any]) -> bytes:
    """The bytes hashed for a record: JSON with sorted keys and no spaces."""
    return json.dumps(
        fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def record_fields(record: AuditRecord) -> dict[str, Any]:
    """The fields a record's hash covers (everything but the hash itself)."""
    return {
        "id": int(record.id),
        "at": float(record.at),
        "user": record.user,
        "tenant": record.tenant,
        "action": record.action,
        "object": record.object,
        "source": record.source,
        "result": record.result,
        "detail": record.detail,
        "prev_hash": record.prev_hash,
    }


def record_hash(record: AuditRecord) -> str:
    """The hash ``record`` must carry."""
    return hashlib.sha256(canonical(record_fields(record))).hexdigest()


def _lock_chain(db: Session) -> None:
    """Hold the chain until the transaction ends (blocks while another append holds it)."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CHAIN_LOCK_KEY})
    else:
        # A write statement takes SQLite's one write lock, waiting out the busy timeout.
        db.execute(_TOUCH)


_RECORDS = Base.metadata.tables["audit_records"]
# Built once (a statement built per call costs more than its execution on SQLite).
_TOUCH = update(_RECORDS).where(_RECORDS.c.id == -1).values(id=_RECORDS.c.id)
_HEAD_ROW = select(_RECORDS.c.id, _RECORDS.c.hash).order_by(_RECORDS.c.id.desc()).limit(1)
_INSERT = insert(_RECORDS)
_HEAD = "allotment_audit_head"
"""Where ``session.info`` keeps the chain's head as this transaction left it."""


def _head(db: Session) -> tuple[int, str] | None:
    """The chain's head ``(id, hash)`` (``None``: empty), with the chain held: locked
    and read on the transaction's first append; its later appends (a group of requests'
    writes) know the head, since they wrote it."""
    txn = (db.get_transaction(), db.get_nested_transaction())
    known = db.info.get(_HEAD)
    if known is not None and known[0] == txn:
        head: tuple[int, str] | None = known[1]
        return head
    _lock_chain(db)
    row = db.execute(_HEAD_ROW).first()
    return None if row is None else (int(row.id), str(row.hash))


def append(
    db: Session,
    *,
    at: float,
    user: str,
    tenant: str | None,
    action: str,
    object: str,
    source: str,
    result: str,
    detail: dict[str, Any] | None = None,
) -> AuditRecord:
    """Append one record at the head of the chain, in ``db``'s transaction; the caller
    commits. Blocks while another transaction appends."""
    head = _head(db)
    fields: dict[str, Any] = {
        "id": 1 if head is None else head[0] + 1,
        "at": float(at),
        "user": user,
        "tenant": tenant,
        "action": action,
        "object": object,
        "source": source,
        "result": result,
        "detail": json.loads(canonical(detail or {})),
        "prev_hash": GENESIS if head is None else head[1],
    }
    fields["hash"] = hashlib.sha256(canonical(fields)).hexdigest()
    db.execute(_INSERT, fields)  # Core: cheaper than the unit of work's flush
    db.info[_HEAD] = (
        (db.get_transaction(), db.get_nested_transaction()),
        (fields["id"], fields["hash"]),
    )
    record = AuditRecord(**fields)
    make_transient_to_detached(record)
    db.add(record)  # as a flush would have left it
    return record


def append_system(
    db: Session, *, at: float, tenant: str | None, action: str, object: str, detail: dict[str, Any]
) -> AuditRecord:
    """Append a record of what the platform did by itself (:data:`SYSTEM_USER`)."""
    return append(
        db,
        at=at,
        user=SYSTEM_USER,
        tenant=tenant,
        action=action,
        object=object,
        source=SYSTEM_SOURCE,
        result="ok",
        detail=detail,
    )


def list_records(
    db: Session,
    *,
    user: str | None = None,
    tenant: str | None = None,
    action: str | None = None,
    object: str | None = None,
    since: float | None = None,
    until: float | None = None,
    after: int | None = None,
    limit: int = 100,
) -> list[AuditRecord]:
    """Records matching every filter given, by id; ``after`` is the last id seen."""
    query = select(AuditRecord).order_by(AuditRecord.id).limit(limit)
    if user is not None:
        query = query.where(AuditRecord.user == user)
    if tenant is not None:
        query = query.where(AuditRecord.tenant == tenant)
    if action is not None:
        query = query.where(AuditRecord.action == action)
    if object is not None:
        query = query.where(AuditRecord.object == object)
    if since is not None:
        query = query.where(AuditRecord.at >= since)
    if until is not None:
        query = query.where(AuditRecord.at < until)
    if after is not None:
        query = query.where(AuditRecord.id > after)
    return list(db.scalars(query))


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What :func:`verify_chain` found: the first bad record (``None`` if none), how
    many records it checked, and the hash at the head of the chain."""

    first_bad: tuple[int, str] | None
    checked: int
    head_hash: str


def _records(db: Session) -> Iterator[AuditRecord]:
    last = 0
    while True:
        batch = list(
            db.scalars(
                select(AuditRecord)
                .where(AuditRecord.id > last)
                .order_by(AuditRecord.id)
                .limit(VERIFY_BATCH)
            )
        )
        yield from batch
        if len(batch) < VERIFY_BATCH:
            return
        last = int(batch[-1].id)
        db.expunge_all()


def verify(db: Session) -> Verdict:
    """Walk the chain from the first record; stop at the first one that is wrong."""
    expected_id = 1
    prev = GENESIS
    checked = 0
    for record in _records(db):
        checked += 1
        problem = _problem(record, expected_id, prev)
        if problem is not None:
            return Verdict(first_bad=(int(record.id), problem), checked=checked, head_hash=prev)
        expected_id = int(record.id) + 1
        prev = record.hash
    return Verdict(first_bad=None, checked=checked, head_hash=prev)


def _problem(record: AuditRecord, expected_id: int, prev: str) -> str | None:
    if int(record.id) != expected_id:
        missing = (
            f"{expected_id}" if record.id == expected_id + 1 else f"{expected_id}-{record.id - 1}"
        )
        return f"record {missing} missing before it (deleted)"
    if record.prev_hash != prev:
        return "prev_hash does not match the record before it (deleted, inserted or reordered)"
    if record.hash != record_hash(record):
        return "contents changed since it was written (hash mismatch)"
    return None


def verify_chain(db: Session) -> tuple[int, str] | None:
    """``None`` when the chain is intact, else ``(record id, what is wrong)`` for the
    first bad record."""
    return verify(db).first_bad
