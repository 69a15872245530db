"""Idempotency keys of submissions: what a repeated ``Idempotency-Key`` answers.

A client whose ``POST /jobs`` got no answer (a dropped connection, a timeout) cannot
know whether the job was stored; with a key it simply sends the request again. The key
is the user's own (two users may use the same one), is kept for :data:`KEPT_S`, and
binds one request: the same key with another body is refused."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, delete, insert, select
from sqlalchemy.orm import Session

from allotment.store.models import Base, IdempotencyKey

KEPT_S = 24 * 3600.0
"""How long a key is remembered."""

_KEYS = Base.metadata.tables["idempotency_keys"]
"""Read and written with Core statements, built once: a submission's key costs two
statements and never an object in the session."""
_FIND = select(_KEYS.c.digest, _KEYS.c.job_ids, _KEYS.c.created_at).where(
    _KEYS.c.user == bindparam("p_user"), _KEYS.c.key == bindparam("p_key")
)
_FORGET_EXPIRED = delete(_KEYS).where(
    _KEYS.c.user == bindparam("p_user"),
    _KEYS.c.key == bindparam("p_key"),
    _KEYS.c.created_at < bindparam("p_before"),
)
_RECORD = insert(_KEYS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Made:
    """What a key made: the request's digest and the jobs, and when."""

    user: str
    key: str
    digest: str
    job_ids: list[str]
    created_at: float

    def expired(self, now: float) -> bool:
        return self.created_at < now - KEPT_S


def find(session: Session, user: str, key: str, *, now: float) -> Made | None:
    """The submission ``user`` made with ``key`` within :data:`KEPT_S`, if any."""
    made = earlier(session, user, key)
    return None if made is None or made.expired(now) else made


def earlier(session: Session, user: str, key: str) -> Made | None:
    """What ``user`` made with ``key``, expired or not."""
    row = session.execute(_FIND, {"p_user": user, "p_key": key}).first()
    if row is None:
        return None
    return Made(
        user=user,
        key=key,
        digest=row.digest,
        job_ids=list(row.job_ids),
        created_at=float(row.created_at),
    )


def record(
    session: Session,
    user: str,
    key: str,
    digest: str,
    job_ids: list[str],
    *,
    now: float,
    replacing: bool = True,
) -> None:
    """Remember what ``key`` made (in the submission's transaction), replacing the key's
    expired record if there is one (``replacing=False``: the caller found none in this
    transaction). A concurrent submission with the same key that committed first makes
    this insert fail on the primary key: the caller rolls back and reads the winner's
    answer."""
    if replacing:
        session.execute(_FORGET_EXPIRED, {"p_user": user, "p_key": key, "p_before": now - KEPT_S})
    session.execute(
        _RECORD,
        {"user": user, "key": key, "digest": digest, "job_ids": job_ids, "created_at": now},
    )


def prune(session: Session, *, now: float) -> int:
    """Forget every key older than :data:`KEPT_S`; return how many (periodic upkeep)."""
    result = session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < now - KEPT_S))
    return int(getattr(result, "rowcount", 0) or 0)
