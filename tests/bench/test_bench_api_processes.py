"""The API-processes bench on a few jobs, one and two processes, and two on a fresh
PostgreSQL database: every submission is stored (``run`` raises otherwise; behaviour
only, no figure is checked)."""

from __future__ import annotations

import pytest
from bench.bench_api_processes import run

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.mark.parametrize(("processes", "db"), [(1, None), (2, None), (2, POSTGRES)])
def test_every_submission_through_the_api_processes_is_stored(
    processes: int, db: str | None
) -> None:
    assert run(processes, jobs=24, clients=4, client_procs=0, db=db) > 0
