"""The API-processes bench on a few jobs, one and two processes: every submission is
stored (``run`` raises otherwise; behaviour only, no figure is checked)."""

from __future__ import annotations

import pytest
from bench.bench_api_processes import run


@pytest.mark.parametrize("processes", [1, 2])
def test_every_submission_through_the_api_processes_is_stored(processes: int) -> None:
    assert run(processes, jobs=24, clients=4, client_procs=0) > 0
