"""``POST /api/v1/jobs/{job_id}/cancel`` through the typed client, against a real HTTP
server; a running job with a real control loop and real processes."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from allotment.api.app import create_app
from allotment.client import AllotmentClient, ClientError
from allotment.control.loop import ControlLoop
from allotment.domain.loading import load_cluster
from allotment.executors.local import LocalExecutor
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.models import Attempt
from tests.api.conftest import EXAMPLES, Server, serve
from tests.control.conftest import wait_until
from tests.executors.processes import kill_everything


def spec(command: list[str] | None = None, queue: str = "default") -> str:
    return json.dumps(
        {
            "name": "c",
            "queue": queue,
            "replicas": [{"count": 1, "resources": {"gpu": 1, "cpu": 1, "memory": "1Gi"}}],
            "command": command or ["python", "train.py"],
        }
    )


def test_cancel_a_pending_job(client: AllotmentClient) -> None:
    job = client.submit(spec())
    cancelled = client.cancel(job["id"])
    assert (cancelled["id"], cancelled["state"], cancelled["failure_class"]) == (
        job["id"],
        "cancelled",
        "cancelled",
    )
    assert client.get_job(job["id"]) == cancelled
    last = client.events(job["id"])[-1]
    assert (last["from_state"], last["to_state"]) == ("pending", "cancelled")


def test_cancel_answers_200_with_the_job(server: Server, client: AllotmentClient) -> None:
    job = client.submit(spec())
    response = httpx.post(f"{server.url}/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"


def test_cancel_of_an_ended_job_is_409_and_changes_nothing(client: AllotmentClient) -> None:
    job = client.submit(spec())
    client.cancel(job["id"])
    before = (client.get_job(job["id"]), client.events(job["id"]))
    with pytest.raises(ClientError) as caught:
        client.cancel(job["id"])
    err = caught.value
    assert (err.status, err.code) == (409, "already_ended")
    assert job["id"] in err.message and "cancelled" in err.message
    assert err.fields == {"job": job["id"], "state": "cancelled", "action": "cancel"}
    assert (client.get_job(job["id"]), client.events(job["id"])) == before


def test_cancel_of_an_unknown_job_is_404(client: AllotmentClient) -> None:
    with pytest.raises(ClientError) as caught:
        client.cancel("j-0000")
    assert (caught.value.status, caught.value.code) == (404, "not_found")


def test_openapi_lists_the_cancel_route(server: Server) -> None:
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert "post" in paths["/api/v1/jobs/{job_id}/cancel"]


def test_cancel_a_running_job_stops_it_and_frees_its_resources(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    cluster = load_cluster(EXAMPLES / "cluster-local.yaml")
    state_root = tmp_path / "state"
    executor = LocalExecutor(state_root)
    loop = ControlLoop(
        cluster,
        sessions,
        executor,
        work_root=tmp_path / "work",
        clock=time.time,
        stop_grace_s=1.0,
    )
    app = create_app(cluster=cluster, store_sessions=sessions, clock=time.time)

    def tick() -> None:
        loop.observe()
        loop.cycle()

    try:
        with serve(app) as url, AllotmentClient(url, timeout=10) as client:
            sleeper = spec([sys.executable, "-c", "import time; time.sleep(30)"])
            job_id = client.submit(sleeper)["id"]

            def running() -> bool:
                tick()
                return client.get_job(job_id)["state"] == "running"

            wait_until(running, "the job running")
            assert client.cancel(job_id)["state"] == "cancelled"
            loop.observe()
            assert loop.session.running[job_id].terminating

            def closed() -> bool:
                tick()
                with sessions() as db:
                    attempt = db.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
                    return attempt.end_time is not None

            wait_until(closed, "the attempt closed")
            assert loop.session.running == {}
            with sessions() as db:
                attempt = db.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
            assert (attempt.state, attempt.signal) == ("cancelled", signal.SIGTERM)
            job = client.get_job(job_id)
            assert (job["state"], job["failure_class"]) == ("cancelled", "cancelled")
    finally:
        kill_everything(state_root)
        for child in executor._children.values():
            child.wait(timeout=5)
        engine.dispose()
