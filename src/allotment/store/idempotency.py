"""Idempotency keys of submissions: what a repeated ``Idempotency-Key`` answers.

A client whose ``POST /jobs`` got no answer (a dropped connection, a timeout) cannot
know whether the job was stored; with a key it simply sends the request again. The key
is the user's own (two users may use the same one), is kept for :data:`KEPT_S`, and
binds one request: the same key with another body is refused."""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy.orm import Session

from allotment.store.models import IdempotencyKey

KEPT_S = 24 * 3600.0
"""How long a key is remembered."""


def find(session: Session, user: str, key: str, *, now: float) -> IdempotencyKey | None:
    """The submission ``user`` made with ``key`` within :data:`KEPT_S`, if any."""
    row = session.get(IdempotencyKey, (user, key))
    if row is None or row.created_at < now - KEPT_S:
        return None
    return row


def record(
    session: Session, user: str, key: str, digest: str, job_ids: list[str], *, now: float
) -> None:
    """Remember what ``key`` made (in the submission's transaction), replacing the key's
    expired record if there is one. A concurrent submission with the same key that
    committed first makes this insert fail on the primary key: the caller rolls back
    and reads the winner's answer."""
    session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.user == user,
            IdempotencyKey.key == key,
            IdempotencyKey.created_at < now - KEPT_S,
        )
    )
    session.add(IdempotencyKey(user=user, key=key, digest=digest, job_ids=job_ids, created_at=now))
    session.flush()


def prune(session: Session, *, now: float) -> int:
    """Forget every key older than :data:`KEPT_S`; return how many (periodic upkeep)."""
    result = session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < now - KEPT_S))
    return int(getattr(result, "rowcount", 0) or 0)
