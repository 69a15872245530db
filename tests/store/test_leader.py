"""The leader lock on a real database: PostgreSQL's advisory lock, SQLite's file lock."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from allotment.control.leader import LOCK_SUFFIX, acquire_leadership
from allotment.store.db import make_engine


@pytest.fixture
def key() -> int:
    """A lock key of this test's own: advisory locks span the whole database, and other
    test runs may share it."""
    return random.randrange(1, 2**62)


def test_a_second_acquisition_fails_until_the_first_releases(engine: Engine, key: int) -> None:
    first = acquire_leadership(engine, key=key)
    assert first is not None and first.held and first.check()
    assert acquire_leadership(engine, key=key) is None
    assert acquire_leadership(engine, key=key) is None  # a refusal holds nothing
    first.release()
    assert not first.held and not first.check()
    first.release()  # idempotent
    second = acquire_leadership(engine, key=key)
    assert second is not None
    with second:
        assert acquire_leadership(engine, key=key) is None
    assert not second.held
    third = acquire_leadership(engine, key=key)
    assert third is not None
    third.release()


def test_another_engine_on_the_same_database_is_refused(engine: Engine, key: int) -> None:
    other = make_engine(engine.url.render_as_string(hide_password=False))
    try:
        leader = acquire_leadership(engine, key=key)
        assert leader is not None
        with leader:
            assert acquire_leadership(other, key=key) is None
        again = acquire_leadership(other, key=key)
        assert again is not None
        again.release()
    finally:
        other.dispose()


def test_the_sqlite_lock_file_sits_next_to_the_database(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    leader = acquire_leadership(engine)
    assert leader is not None
    assert (tmp_path / f"allotment.db{LOCK_SUFFIX}").exists()
    leader.release()
    engine.dispose()


def test_in_memory_sqlite_always_leads() -> None:
    engine = make_engine("sqlite://")
    first, second = acquire_leadership(engine), acquire_leadership(engine)
    assert first is not None and second is not None
    first.release()
    second.release()


def test_a_postgres_leader_whose_connection_dies_loses_the_lock(engine: Engine, key: int) -> None:
    if engine.url.get_backend_name() != "postgresql":
        pytest.skip("PostgreSQL only: a SQLite lock lives as long as its process")
    leader = acquire_leadership(engine, key=key)
    assert leader is not None
    with engine.begin() as connection:
        holder = connection.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = :high AND objid = :low AND granted"
            ),
            {"high": key >> 32, "low": key & 0xFFFFFFFF},
        ).scalar_one()
        connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": holder})
    deadline = time.monotonic() + 10
    while (again := acquire_leadership(engine, key=key)) is None:
        assert time.monotonic() < deadline, "the lock outlived its connection"
        time.sleep(0.05)
    assert not leader.check()
    leader.release()  # its connection is gone: nothing to undo, no error
    again.release()
