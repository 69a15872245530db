"""Store tokens found valid are remembered briefly (no store read per request), never
past their expiry, and forgotten at once when a token is revoked through the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.auth import (
    ANONYMOUS,
    AdminDigest,
    FirstOf,
    Principal,
    StoreTokens,
    authenticate,
    authenticate_now,
    token_digest,
)
from allotment.api.tokens import TokenService
from allotment.domain.errors import Unauthenticated
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.tenancy import CLUSTER, issue


class Counted:
    """A session factory that counts the sessions opened."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.opened = 0

    def __call__(self) -> Session:
        self.opened += 1
        return self.sessions()

    def begin(self) -> Any:
        return self.sessions.begin()


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    return session_factory(engine)


def test_a_valid_token_is_read_once_per_cache_period(sessions: sessionmaker[Session]) -> None:
    counted = Counted(sessions)
    clock = {"mono": 100.0}
    tokens = StoreTokens(counted, clock=lambda: 50.0, monotonic=lambda: clock["mono"])  # type: ignore[arg-type]
    _, token = issue(sessions, "bob", "vision", "member")
    first = tokens.authenticate(token)
    assert first is not None and first.user == "bob" and counted.opened == 1
    clock["mono"] += 1.9
    assert tokens.authenticate(token) == first and counted.opened == 1  # remembered
    clock["mono"] += 0.2
    assert tokens.authenticate(token) == first and counted.opened == 2  # read again
    assert tokens.authenticate("allot_unknown") is None and counted.opened == 3  # not kept


def test_a_remembered_token_still_expires_on_time(sessions: sessionmaker[Session]) -> None:
    now = {"wall": 10.0}
    tokens = StoreTokens(sessions, clock=lambda: now["wall"], monotonic=lambda: 0.0)
    _, token = issue(sessions, "bob", "vision", "member", expires_at=11.0)
    assert tokens.authenticate(token) is not None
    now["wall"] = 11.0  # expired, though remembered a moment ago
    with pytest.raises(Unauthenticated) as caught:
        tokens.authenticate(token)
    assert caught.value.fields["why"] == "expired"


def test_revoking_through_the_server_forgets_remembered_tokens_at_once(
    sessions: sessionmaker[Session],
) -> None:
    tokens = StoreTokens(sessions, clock=lambda: 50.0, monotonic=lambda: 0.0)
    service = TokenService(
        cluster=lambda: load_cluster_text(CLUSTER),
        sessions=sessions,
        clock=lambda: 50.0,
        on_revoke=tokens.forget,
    )
    token_id, token = issue(sessions, "bob", "vision", "member")
    _, admin_token = issue(sessions, "root", None, "admin")
    assert tokens.authenticate(token) is not None
    admin = tokens.authenticate(admin_token)
    assert admin is not None
    service.revoke(admin, token_id)
    with pytest.raises(Unauthenticated) as caught:
        tokens.authenticate(token)
    assert caught.value.fields["why"] == "revoked"


def test_a_remembered_token_is_answered_without_io_and_others_are_not(
    sessions: sessionmaker[Session],
) -> None:
    counted = Counted(sessions)
    clock = {"mono": 100.0, "wall": 50.0}
    tokens = StoreTokens(
        counted,  # type: ignore[arg-type]
        clock=lambda: clock["wall"],
        monotonic=lambda: clock["mono"],
    )
    admin = AdminDigest(token_digest("allot_admin"), user="root")
    both = FirstOf([admin, tokens])
    _, token = issue(sessions, "bob", "vision", "member", expires_at=60.0)
    assert both.answer_now("allot_admin") == (True, admin.authenticate("allot_admin"))
    assert both.answer_now(token) == (False, None)  # must read the store
    assert authenticate_now(both, token) is None and counted.opened == 0
    bob = authenticate(both, token)
    assert counted.opened == 1
    assert both.answer_now(token) == (True, bob)
    assert authenticate_now(both, token) == bob and counted.opened == 1
    clock["mono"] += 2.0  # no longer remembered: read again
    assert authenticate_now(both, token) is None
    authenticate(both, token)
    clock["wall"] = 60.0  # expired: never answered from memory
    assert authenticate_now(both, token) is None
    tokens.forget()
    assert both.answer_now(token) == (False, None)


def test_what_needs_no_authenticator_or_no_token_is_answered_at_once() -> None:
    assert authenticate_now(None, None) is ANONYMOUS
    with pytest.raises(Unauthenticated) as caught:
        authenticate_now(AdminDigest(token_digest("allot_a"), user="root"), None)
    assert caught.value.fields["why"] == "missing"
    with pytest.raises(Unauthenticated) as caught:
        authenticate_now(AdminDigest(token_digest("allot_a"), user="root"), "allot_b")
    assert caught.value.fields["why"] == "invalid"

    class Plain:  # an authenticator without answer_now: always asked in a worker
        def authenticate(self, token: str) -> Principal | None:
            return None

    assert authenticate_now(Plain(), "allot_a") is None
    assert authenticate_now(FirstOf([Plain()]), "allot_a") is None
