"""``POST /tokens`` with bad input, on SQLite and PostgreSQL: control characters in the
user or tenant and absurd lifetimes are a clear 422, and no token is stored."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from typer.testing import CliRunner

from allotment.api.app import create_app
from allotment.api.auth import StoreTokens
from allotment.cli.main import app as cli
from allotment.client import AllotmentClient, ClientError
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import session_factory
from allotment.store.models import ApiToken
from tests.api.conftest import serve
from tests.api.tenancy import CLUSTER, issue
from tests.store.conftest import engine  # noqa: F401  (the parametrized fixture)


@pytest.fixture
def root(engine: Engine, tmp_path: Path) -> Iterator[tuple[AllotmentClient, Engine]]:  # noqa: F811
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    application = create_app(
        cluster=load_cluster_text(CLUSTER),
        store_sessions=sessions,
        clock=time.time,
        authenticator=StoreTokens(sessions, clock=time.time),
    )
    _, token = issue(sessions, "root", None, "admin")
    with serve(application) as url, AllotmentClient(url, token, timeout=10) as client:
        yield client, engine


def stored(db: Engine) -> int:
    with db.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(ApiToken)).scalar_one())


@pytest.mark.parametrize(
    ("user", "tenant", "named"),
    [
        ("ro\x00ot", None, "user"),
        ("bob\nadmin", "vision", "user"),
        ("\x1b[31mbob", "vision", "user"),
        ("bob", "vis\x00ion", "tenant"),
    ],
)
def test_fault_token_names_with_control_characters_are_a_422(
    root: tuple[AllotmentClient, Engine], user: str, tenant: str | None, named: str
) -> None:
    client, db = root
    with pytest.raises(ClientError) as caught:
        client.create_token(user=user, tenant=tenant)
    err = caught.value
    assert (err.status, err.code) == (422, "invalid_input"), err
    assert named in err.message and "control characters" in err.message
    assert stored(db) == 1  # only root's


@pytest.mark.parametrize("expires_in", ["1e308", "3651d", "0", "-1", "inf", "nan"])
def test_fault_token_lifetimes_out_of_range_are_a_422(
    root: tuple[AllotmentClient, Engine], expires_in: str
) -> None:
    client, db = root
    with pytest.raises(ClientError) as caught:
        client.create_token(user="bob", tenant="vision", expires_in=expires_in)
    assert caught.value.status == 422, caught.value
    assert "expires_in" in caught.value.message
    assert stored(db) == 1


def test_fault_token_lifetime_as_a_huge_json_number_is_a_422(
    root: tuple[AllotmentClient, Engine],
) -> None:
    client, db = root
    response = client._http.post(
        "/tokens", json={"user": "bob", "tenant": "vision", "expires_in": 1e308}
    )
    assert response.status_code == 422, response.text
    assert "3650d" in response.json()["message"]
    assert stored(db) == 1


def test_fault_token_ls_shows_a_far_expiry_without_a_traceback(
    engine: Engine,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    application = create_app(
        cluster=load_cluster_text(CLUSTER),
        store_sessions=sessions,
        clock=time.time,
        authenticator=StoreTokens(sessions, clock=time.time),
    )
    _, token = issue(sessions, "root", None, "admin")
    issue(sessions, "old", None, "admin", expires_at=1e308)  # stored before the bound
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with serve(application) as url:
        result = CliRunner().invoke(cli, ["token", "ls", "--url", url, "--token", token])
    assert result.exit_code == 0, result.output
    assert "old" in result.stdout and "Traceback" not in result.output
