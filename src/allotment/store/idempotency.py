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


class KeyTaken(Exception):
    """Another submission with this key committed first."""


def find(session: Session, user: str, key: str, *, now: float) -> IdempotencyKey | None:
    """The submission ``user`` made with ``key`` within :data:`KEPT_S`, if any."""
    row = session.get(IdempotencyKey, (user, key))
    if row is None or row.created_at < now - KEPT_S:
        return None
    return row


def record(
    session: Session, user: str, key: str, digest: str, job_ids: list[str], *, now: float
) -> None:
    """Remember what ``key`` made (in the submission's transaction); forget expired
    keys. A concurrent submission with the same key that committed first raises
    :class:`KeyTaken` here, or makes this commit fail on the primary key: either way
    the caller rolls back and reads the winner's answer."""
    session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < now - KEPT_S))
    stale = session.get(IdempotencyKey, (user, key))
    if stale is not None:
        if stale.created_at >= now - KEPT_S:
            raise KeyTaken(key)  # a concurrent request with this key committed first
        session.delete(stale)  # expired: the key may be used afresh
        session.flush()
    session.add(IdempotencyKey(user=user, key=key, digest=digest, job_ids=job_ids, created_at=now))
    session.flush()
