"""The reliability campaigns, short: real ``allot up`` servers killed, their lock
connection cut and their supervisors killed under load, on SQLite and PostgreSQL. No
acknowledged job is lost, stored twice or run twice, no GPU is held by two jobs at once,
and every bad request is a 4xx (``bench/bench_reliability.py`` runs them long)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.reliability.campaigns import (
    bad_input,
    crash_loop,
    failover,
    launch_window,
    supervisor_kills,
)
from bench.reliability.deploy import POSTGRES_URL
from bench.reliability.runs import Figures
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError


def _postgres_down() -> str | None:
    engine = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as exc:
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {exc}"
    finally:
        engine.dispose()
    return None


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest) -> str:
    if request.param == "postgresql" and (why := _postgres_down()):
        pytest.skip(why)
    return str(request.param)


def assert_clean(figures: Figures) -> None:
    assert figures.clean, figures.to_dict()
    assert figures.faults > 0 and figures.acknowledged > 0, figures.to_dict()


def test_crash_loop_of_sigkills_loses_and_double_books_nothing(tmp_path: Path, store: str) -> None:
    figures = crash_loop(tmp_path, store, seconds=15)
    assert_clean(figures)
    assert figures.retried == 0 and figures.states == {"succeeded": figures.acknowledged}


def test_crash_in_the_launch_window_launches_every_job_once(tmp_path: Path, store: str) -> None:
    figures = launch_window(tmp_path, store, seconds=12)
    assert_clean(figures)
    assert figures.retried == 0 and figures.states == {"succeeded": figures.acknowledged}


def test_fault_killed_supervisors_never_double_book_their_gpus(tmp_path: Path, store: str) -> None:
    figures = supervisor_kills(tmp_path, store, seconds=12)
    assert_clean(figures)
    assert figures.retried > 0  # the kills hit running replicas
    assert set(figures.failures) <= {"node_failure"}


def test_fault_failover_with_the_lock_connection_cut_never_double_books(tmp_path: Path) -> None:
    if why := _postgres_down():
        pytest.skip(why)
    figures = failover(tmp_path, "postgresql", seconds=15)
    assert_clean(figures)
    assert figures.leaderships >= 2  # leadership did move
    assert figures.states == {"succeeded": figures.acknowledged}


def test_reliab_every_bad_request_is_a_4xx_that_stores_nothing(tmp_path: Path, store: str) -> None:
    figures = bad_input(tmp_path, store)
    assert figures.faults >= 30
    assert figures.clean, figures.notes
