"""The token repository on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from allotment.domain.errors import NotFound
from allotment.store.tokens import (
    create_token,
    get_token,
    list_tokens,
    revoke_token,
    token_by_digest,
)


def _make(sessions: sessionmaker[Session], digest: str, tenant: str | None, at: float) -> str:
    with sessions.begin() as db:
        return create_token(
            db, digest=digest, user="u", tenant=tenant, role="member", created_by="x", at=at
        ).id


def test_create_find_list_revoke(sessions: sessionmaker[Session]) -> None:
    a = _make(sessions, "a" * 64, "vision", 1.0)
    b = _make(sessions, "b" * 64, "nlp", 2.0)
    with sessions() as db:
        found = token_by_digest(db, "a" * 64)
        assert found is not None and found.id == a and found.revoked_at is None
        assert token_by_digest(db, "c" * 64) is None
        assert [t.id for t in list_tokens(db)] == [a, b]
        assert [t.id for t in list_tokens(db, tenant="nlp")] == [b]
    with sessions.begin() as db:
        assert revoke_token(db, a, at=5.0).revoked_at == 5.0
    with sessions.begin() as db:
        assert revoke_token(db, a, at=9.0).revoked_at == 5.0  # already revoked: unchanged
    with sessions() as db, pytest.raises(NotFound):
        get_token(db, "t-missing")


def test_digests_are_unique(sessions: sessionmaker[Session]) -> None:
    _make(sessions, "d" * 64, None, 1.0)
    with pytest.raises(IntegrityError):
        _make(sessions, "d" * 64, None, 2.0)
