"""The read side on each store: SQLite and PostgreSQL (skipped when PostgreSQL cannot be
reached; see ``tests/store/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

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
