"""Store fixtures: every test runs on SQLite and on PostgreSQL, each on clean tables.

PostgreSQL is ``ALLOTMENT_TEST_POSTGRES_URL`` (default: the local ``test`` database as
user ``postgres``); each test gets its own schema, dropped afterwards. When that server
cannot be reached the PostgreSQL cases are skipped, not failed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from allotment.store import migrate
from allotment.store.db import make_engine, session_factory

POSTGRES_URL = os.environ.get(
    "ALLOTMENT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

_postgres_error: list[str] = []


def _postgres_unreachable() -> str | None:
    """Why PostgreSQL cannot be used, or ``None``; probed once per run."""
    if not _postgres_error:
        engine = make_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            _postgres_error.append("")
        except OperationalError as exc:
            first = str(exc.orig or exc).strip().splitlines()[0]
            _postgres_error.append(f"PostgreSQL not reachable at {POSTGRES_URL}: {first}")
        finally:
            engine.dispose()
    return _postgres_error[0] or None


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty database (nothing migrated yet)."""
    if request.param == "sqlite":
        eng = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
        yield eng
        eng.dispose()
        return
    why = _postgres_unreachable()
    if why:
        pytest.skip(why)
    schema = f"allot_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    eng = make_engine(POSTGRES_URL, connect_args={"options": f"-c search_path={schema}"})
    try:
        yield eng
    finally:
        eng.dispose()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    """A session factory on a database migrated to the newest revision."""
    migrate.upgrade(engine)
    return session_factory(engine)
