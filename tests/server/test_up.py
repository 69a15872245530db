"""``allot up`` started as a user starts it: a real process, a real port, a real store."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from allotment.client import ClientError
from tests.server.conftest import EXAMPLES, Up

JOB = """name: hello
queue: default
replicas: [{count: 1, resources: {gpu: 1, cpu: 1, memory: 1Gi}}]
command: [python3, -c, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
"""


def wait_state(up: Up, job_id: str, states: set[str], timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    with up.client() as client:
        while time.monotonic() < deadline:
            state = client.get_job(job_id)["state"]
            if state in states:
                return state
            time.sleep(0.1)
    raise AssertionError(f"{job_id} stayed {state}")


def test_up_writes_the_cli_config_and_runs_a_job(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    config = up.config
    assert config["url"] == up.url and len(config["token"]) > 20
    with up.client() as client:
        job = client.submit(JOB)
    assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"
    status, err = up.stop()
    assert status in (0, -signal.SIGTERM) and "Traceback" not in err


def test_the_api_refuses_requests_without_the_token(up: Up) -> None:
    up.start()
    answer = httpx.get(f"{up.url}/api/v1/jobs")
    assert answer.status_code == 401 and answer.json()["code"] == "unauthenticated"
    bad = httpx.get(f"{up.url}/api/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "not valid" in bad.json()["message"]
    assert httpx.get(f"{up.url}/api/v1/healthz").status_code == 200
    assert httpx.get(f"{up.url}/").status_code == 401


def test_the_dashboard_shows_jobs_with_the_token_cookie(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    with up.client() as client:
        job = client.submit(JOB.replace("name: hello", "name: <b>dash</b>"))
    wait_state(up, job["id"], {"succeeded"})
    with httpx.Client(base_url=up.url, follow_redirects=True) as browser:
        first = browser.get(f"/?token={up.config['token']}")
        assert first.status_code == 200  # redirected to / with the cookie set
        assert "token=" not in str(first.url)
        page = browser.get("/").text
    assert job["id"] in page and "succeeded" in page
    assert "&lt;b&gt;dash&lt;/b&gt;" in page and "<b>dash</b>" not in page
    assert "workstation" in page  # the queue tree


def test_fault_the_dashboard_cookie_reads_but_never_writes(up: Up) -> None:
    # A browser sends the cookie by itself, so another page could forge a write with
    # it: writes need the bearer header.
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    with httpx.Client(base_url=up.url, follow_redirects=True) as browser:
        assert browser.get(f"/?token={up.config['token']}").status_code == 200
        assert browser.get("/api/v1/jobs").status_code == 200  # reading with the cookie
        forged = browser.post("/api/v1/jobs", json={"spec": JOB})
        assert forged.status_code == 401 and forged.json()["code"] == "unauthenticated"
        # The dashboard's own buttons write with the cookie only with htmx's header,
        # which another site's page cannot send.
        forged = browser.post("/ui/jobs/j-1/cancel")
        assert forged.status_code == 401 and forged.json()["code"] == "unauthenticated"
        unknown = browser.post("/ui/jobs/j-1/cancel", headers={"HX-Request": "true"})
        assert unknown.status_code == 404  # authenticated by the cookie: no such job
        assert browser.get("/api/v1/jobs").json()["jobs"] == []
        auth = {"Authorization": f"Bearer {up.config['token']}"}
        assert browser.post("/api/v1/jobs", json={"spec": JOB}, headers=auth).status_code == 201


def test_a_restart_keeps_the_token_and_the_jobs(up: Up) -> None:
    up.start()
    token = up.config["token"]
    with up.client() as client:
        job = client.submit(JOB)
    wait_state(up, job["id"], {"succeeded"})
    status, err = up.stop(signal.SIGINT)
    assert status in (0, 130, -signal.SIGINT) and "Traceback" not in err, err
    up.start()
    assert up.config["token"] == token
    with up.client() as client:
        assert client.get_job(job["id"])["state"] == "succeeded"


def test_a_busy_port_is_a_clear_error(up: Up) -> None:
    up.start()
    second = Up(root=up.root / "second", port=up.port)
    process = second.start(wait=False)
    up.processes.append(process)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 1
    assert f"cannot listen on 127.0.0.1:{up.port}" in err.decode()
    assert "--port" in err.decode()


def test_a_bad_cluster_file_names_the_key_and_line(up: Up) -> None:
    bad = up.root / "bad.yaml"
    bad.write_text("pools:\n  - name: a\n    pricee: 1\n")
    process = up.start("-f", str(bad), wait=False)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 1
    text = err.decode()
    assert "pricee" in text and "line 3" in text and "Traceback" not in text


def test_cluster_from_the_store_when_no_file_is_given(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    up.stop()
    up.start()
    with up.client() as client:
        names = [q["name"] for q in client.queues()[0]["children"]]
        assert names == ["default", "batch"]
        with pytest.raises(ClientError) as info:
            client.get_job("j-nope")
        assert info.value.status == 404


def test_up_on_postgresql(up: Up) -> None:
    """``--db`` takes a PostgreSQL URL: a database of its own, dropped afterwards. Given
    in ``ALLOT_DB`` instead, the URL is on no command line of the server's processes
    (the scheduler's and two API processes here)."""
    import uuid

    import psutil
    from sqlalchemy import create_engine, text

    name = f"allot_up_{uuid.uuid4().hex[:8]}"
    admin = create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test")
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        up.start("-f", str(EXAMPLES / "cluster-local.yaml"), "--db", url)
        with up.client() as client:
            job = client.submit(JOB)
        assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"
        up.stop()

        up.env_overrides["ALLOT_DB"] = url
        process = up.start("--api-processes", "2", "--scheduler-process")
        with up.client() as client:
            job = client.submit(JOB)
        assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"
        server = psutil.Process(process.pid)
        lines = []
        for each in [server, *server.children(recursive=True)]:
            try:
                lines.append(" ".join(each.cmdline()))
            except psutil.Error:  # a replica's that has just ended
                continue
        assert len(lines) >= 4 and not any(name in line for line in lines), lines
        up.stop()
    finally:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_a_second_server_on_the_same_store_serves_and_takes_over(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    first = up.process
    second = Up(root=up.root)  # same data directory and store, another port
    second.start()
    up.processes.extend(second.processes)
    with second.client() as client:
        job = client.submit(JOB)
    assert wait_state(second, job["id"], {"succeeded", "failed"}) == "succeeded"
    assert first is not None
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    with second.client() as client:
        later = client.submit(JOB)
    assert wait_state(second, later["id"], {"succeeded", "failed"}) == "succeeded"
    _, err = second.stop()
    assert "another server leads" in err and "now runs the scheduler" in err


WHOLE_NODE = """name: whole
queue: default
replicas: [{count: 1, resources: {gpu: 2, cpu: 1, memory: 1Gi}}]
command: [sleep, "3"]
"""


@pytest.mark.parametrize("where", ["--scheduler-thread", "--scheduler-process"])
def test_a_replica_s_end_gives_its_devices_to_the_next_job_at_once(up: Up, where: str) -> None:
    """With a 30 s tick, only the supervisor's message at the first job's end can start
    the job waiting for its devices within seconds."""
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), where, "--tick", "30")
    with up.client() as client:
        first = client.submit(WHOLE_NODE)
        launched = {"starting", "running"}  # seen running at the loop's next turn
        assert wait_state(up, first["id"], launched, timeout=15) in launched
        second = client.submit(JOB)
        time.sleep(1.0)
        assert client.get_job(second["id"])["state"] == "pending"  # the node is full
    assert wait_state(up, first["id"], {"succeeded"}, timeout=15) == "succeeded"
    ended = time.monotonic()
    assert wait_state(up, second["id"], {"succeeded", "failed"}, timeout=15) == "succeeded"
    assert time.monotonic() - ended < 10  # not the 30 s tick
