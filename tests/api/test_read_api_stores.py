"""The read side on each store: SQLite and PostgreSQL (skipped when PostgreSQL cannot be
reached; see ``tests/store/conftest.py``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import Engine

from allotment.client import AllotmentClient
from allotment.domain.lifecycle import JobState
from tests.api.conftest import EXAMPLES
from tests.api.live import job_text, live_stack
from tests.store.conftest import engine  # noqa: F401  (the parametrized fixture)

S = JobState
SLEEP = "import time; time.sleep(60)"


def test_why_usage_and_apply(engine: Engine, tmp_path: Path) -> None:  # noqa: F811
    with live_stack(tmp_path, engine) as live, AllotmentClient(live.url, timeout=20) as api:
        big = api.submit(job_text(SLEEP, gpus=2, expected_runtime="30m"))["id"]
        live.until(big, {S.RUNNING})
        small = api.submit(job_text(SLEEP))["id"]
        live.step()
        why = api.why(small)
        assert why["state"] == "pending" and why["reason"]["code"]
        assert why["holders"][0]["job"] == big and why["estimated_start"]
        [root] = api.queues()
        assert root["usage"]["local"]["used"] == 2 and root["pending"] == 1
        text = (EXAMPLES / "cluster-local.yaml").read_text()
        assert api.apply_cluster(text)["version"] == 1
        assert api.apply_cluster(text + "\n")["version"] == 2
        assert api.cluster()["text"] == text + "\n"


def test_why_guesses_a_start_from_jobs_that_finished_when_none_is_declared(
    engine: Engine,  # noqa: F811
    tmp_path: Path,
) -> None:
    with live_stack(tmp_path, engine) as live, AllotmentClient(live.url, timeout=20) as api:
        # Nothing has finished: behind a job without a runtime there is no estimate.
        holder = api.submit(job_text(SLEEP, gpus=2))["id"]
        live.until(holder, {S.RUNNING})
        waiting = api.submit(job_text(SLEEP))["id"]
        live.step()
        why = api.why(waiting)
        assert why["estimated_start"] is None and why["estimate_basis"] is None
        api.cancel(waiting)
        api.cancel(holder)
        live.until(holder, {S.CANCELLED})
        # Ten short jobs finish: enough history to guess how long jobs here run.
        done = [api.submit(job_text("pass"))["id"] for _ in range(10)]
        for job_id in done:
            assert live.until(job_id, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
        holder = api.submit(job_text(SLEEP, gpus=2))["id"]
        live.until(holder, {S.RUNNING})
        waiting = api.submit(job_text(SLEEP))["id"]
        live.step()
        asked = time.time()
        why = api.why(waiting)
        assert why["state"] == "pending" and why["estimate_basis"] == "history"
        start = datetime.strptime(why["estimated_start"], "%Y-%m-%dT%H:%M:%SZ")
        assert start.replace(tzinfo=UTC).timestamp() >= asked - 1
        # The queue's line and the job's page show the guess, marked as one.
        line = httpx.get(f"{live.url}/ui/queues/default", timeout=20).text
        [row] = [row for row in line.split("<tr>") if waiting in row]
        assert "(guessed)" in row and "unknown" not in row
        job_page = httpx.get(f"{live.url}/ui/jobs/{waiting}", timeout=20).text
        assert "(guessed from the run times of jobs that finished here)" in job_page
        # A declared runtime ahead is taken as it is.
        api.cancel(waiting)
        api.cancel(holder)
        live.until(holder, {S.CANCELLED})
        holder = api.submit(job_text(SLEEP, gpus=2, expected_runtime="30m"))["id"]
        live.until(holder, {S.RUNNING})
        waiting = api.submit(job_text(SLEEP))["id"]
        live.step()
        why = api.why(waiting)
        assert why["estimate_basis"] == "declared" and why["estimated_start"]
        line = httpx.get(f"{live.url}/ui/queues/default", timeout=20).text
        [row] = [row for row in line.split("<tr>") if waiting in row]
        assert why["estimated_start"] in row and "(guessed)" not in row
