"""The read side of the API on a live stack: why, logs, queue usage, pools, nodes and
the cluster file, through the typed client against a real server."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from allotment.api.logs import read_log
from allotment.client import AllotmentClient, ClientError
from allotment.domain.lifecycle import JobState
from allotment.domain.reasons import ReasonCode
from allotment.store.jobs import transition_job
from allotment.store.layout import log_path, logs_dir
from tests.api.conftest import EXAMPLES
from tests.api.live import Live, job_text, live_stack

S = JobState
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with live_stack(tmp_path) as stack:
        yield stack


@pytest.fixture
def api(live: Live) -> Iterator[AllotmentClient]:
    with AllotmentClient(live.url, timeout=20) as c:
        yield c


def _epoch(iso: str) -> float:
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def test_why_a_job_waits_behind_a_running_one(live: Live, api: AllotmentClient) -> None:
    big = api.submit(job_text(SLEEP, gpus=2, name="big", expected_runtime="1h"))["id"]
    live.until(big, {S.RUNNING})
    small = api.submit(job_text(SLEEP, gpus=1, name="small"))["id"]
    live.step()
    assert live.state(small) is S.PENDING

    data = api.why(small)
    assert set(data) >= {"job", "state", "reason", "position", "estimated_start", "holders"}
    assert (data["job"], data["state"]) == (small, "pending")
    reason = data["reason"]
    assert reason["code"] in {c.value for c in ReasonCode}
    assert reason["code"] in ("quota_exhausted", "no_node_fits")
    assert reason["message"] and isinstance(reason["detail"], dict)
    assert data["position"] == {"queue": 1, "pool": 1}
    assert ISO.match(data["estimated_start"])
    started = api.events(big)
    running_at = next(e["at"] for e in started if e["to_state"] == "running")
    # the estimate is the big job's expected end: its start plus one hour
    assert abs(_epoch(data["estimated_start"]) - (running_at + 3600)) < 10
    [holder] = data["holders"]
    assert {k: holder[k] for k in ("job", "queue", "gpu")} == {
        "job": big,
        "queue": "default",
        "gpu": 2,
    }
    assert ISO.match(holder["expected_end"])

    running = api.why(big)
    assert running["state"] == "running" and running["reason"] is None
    assert running["position"] is None and running["holders"] == []
    placement = running["placement"]
    assert placement["pool"] == "local" and placement["nodes"] == ["localhost"]
    assert placement["replicas"][0]["replica"] == "worker-0"
    assert sorted(placement["replicas"][0]["devices"]) == [0, 1]


def test_why_of_an_unknown_job_is_404(api: AllotmentClient) -> None:
    with pytest.raises(ClientError) as caught:
        api.why("j-nope")
    assert (caught.value.status, caught.value.code) == (404, "not_found")


PRINTS = "import sys; print('hello from out'); print('ünïcode'); sys.stderr.write('oops\\n')"


def test_logs_page_through_a_finished_job(live: Live, api: AllotmentClient) -> None:
    job = api.submit(job_text(PRINTS))["id"]
    assert live.until(job, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    for _ in range(50):  # the attempt closes once every replica has ended
        chunk = api.logs(job)
        if chunk["eof"]:
            break
        live.step()
        time.sleep(0.05)
    assert chunk["eof"] and chunk["attempt"] == 1 and chunk["replica"] == "worker-0"
    assert chunk["replicas"] == ["worker-0"]
    assert chunk["data"] == "hello from out\nünïcode\n"
    assert chunk["next_offset"] == len(chunk["data"].encode())
    assert api.logs(job, stream="err")["data"] == "oops\n"

    # page 4 bytes at a time: a character cut in two waits for the next page
    text, offset = "", 0
    while True:
        page = api.logs(job, offset=offset, limit=4)
        assert page["offset"] == offset
        text += page["data"]
        if page["eof"]:
            break
        assert page["next_offset"] > offset
        offset = page["next_offset"]
    assert text == "hello from out\nünïcode\n"

    # The tail (the dashboard's job page): the last bytes, from a whole character on.
    with live.sessions() as db:
        for back, tail in ((5, "code\n"), (6, "code\n"), (8, "nïcode\n"), (100, text)):
            chunk = read_log(
                db,
                live.work_root,
                job,
                attempt=None,
                replica=None,
                stream="out",
                offset=back,
                limit=back,
                from_end=True,
            )
            assert chunk.data == tail and chunk.eof

    with pytest.raises(ClientError) as caught:
        api.logs(job, replica="worker-7")
    assert caught.value.status == 404 and caught.value.fields["replicas"] == ["worker-0"]
    with pytest.raises(ClientError) as caught:
        api.logs(job, attempt=3)
    assert caught.value.status == 404


def test_logs_never_leave_the_jobs_directory(live: Live, api: AllotmentClient) -> None:
    job = api.submit(job_text("print('x')"))["id"]
    live.until(job, {S.SUCCEEDED})
    secret = live.work_root.parent / "secret.txt"
    secret.write_text("do not show")
    out = log_path(live.work_root, "me", job, 1, "worker", 0, "out")
    out.unlink()
    out.symlink_to(secret)
    assert out.parent == logs_dir(live.work_root, "me", job, 1)
    with pytest.raises(ClientError) as caught:
        api.logs(job)
    assert caught.value.status == 404
    assert "do not show" not in caught.value.message


def test_a_logs_directory_replaced_by_a_link_is_not_followed(
    live: Live, api: AllotmentClient
) -> None:
    # A container owns its working directory, the logs directory's parent: it could move
    # its logs away and leave a link to another job's logs in their place.
    other = api.submit(job_text("print('other tenant secret')"))["id"]
    mine = api.submit(job_text("print('mine')"))["id"]
    live.until(other, {S.SUCCEEDED})
    live.until(mine, {S.SUCCEEDED})
    logs = logs_dir(live.work_root, "me", mine, 1)
    logs.rename(logs.with_name("moved"))
    logs.symlink_to(logs_dir(live.work_root, "me", other, 1))
    with pytest.raises(ClientError) as caught:
        api.logs(mine)
    assert caught.value.status == 404
    assert "secret" not in caught.value.message
    assert "other tenant secret" in api.logs(other)["data"]


def test_logs_of_a_job_not_started_yet(live: Live, api: AllotmentClient) -> None:
    big = api.submit(job_text(SLEEP, gpus=2))["id"]
    live.until(big, {S.RUNNING})
    waiting = api.submit(job_text(SLEEP))["id"]
    chunk = api.logs(waiting)
    assert (chunk["attempt"], chunk["data"], chunk["eof"]) == (0, "", False)


def test_logs_refuse_bad_parameters(live: Live, api: AllotmentClient) -> None:
    waiting = api.submit(job_text(SLEEP))["id"]  # an unknown job is a 404 before this
    for query in ("stream=both", "limit=0", "offset=-1", "attempt=0"):
        response = httpx.get(f"{live.url}/api/v1/jobs/{waiting}/logs?{query}", timeout=10)
        assert response.status_code == 422, query
        assert response.json()["code"] == "invalid_request"


def test_queues_pools_and_nodes_show_usage(live: Live, api: AllotmentClient) -> None:
    big = api.submit(job_text(SLEEP, gpus=2))["id"]
    live.until(big, {S.RUNNING})
    api.submit(job_text(SLEEP, queue="batch"))

    [root] = api.queues()
    assert root["name"] == "workstation"
    assert root["usage"] == {"local": {"nominal": 2, "used": 2, "borrowed": 0}}
    assert (root["running"], root["pending"]) == (1, 1)
    children = {q["name"]: q for q in root["children"]}
    assert children["default"]["usage"] == {"local": {"nominal": 1, "used": 2, "borrowed": 1}}
    assert children["batch"]["usage"] == {"local": {"nominal": 1, "used": 0, "borrowed": 0}}
    assert (children["batch"]["running"], children["batch"]["pending"]) == (0, 1)
    assert children["default"]["nominal_gpu"] == {"local": 1}

    [pool] = api.pools()
    assert pool["name"] == "local" and pool["labels"] == {"gpu_model": "virtual"}
    assert pool["nodes"] == ["localhost"]
    assert pool["gpu"] == {"capacity": 2, "allocated": 2, "free": 0}

    [node] = api.nodes()
    assert node["name"] == "localhost" and node["healthy"]
    assert node["capacity"]["gpu"] == 2 and node["free"]["gpu"] == 0
    assert node["allocated"]["memory"] == 1024**3
    assert [(j["job"], j["replica"], j["gpu"]) for j in node["jobs"]] == [(big, "worker-0", 2)]


BIGGER = (
    (EXAMPLES / "cluster-local.yaml")
    .read_text()
    .replace(
        "nodes:\n",
        "nodes:\n  - {name: spare, pool: local, capacity: {gpu: 2, cpu: 8, memory: 16Gi}}\n",
    )
)


def test_an_applied_configuration_is_what_the_loop_schedules_on(
    live: Live, api: AllotmentClient
) -> None:
    """One owner of the cluster: the API applies a configuration with a new queue, and
    the loop, at its next turn, admits and runs a job of that queue on it."""
    text = BIGGER + "  - name: newcomers\n    tenant: me\n    quota: {local: {gpu: 1}}\n"
    api.apply_cluster(text)
    assert live.loop.state.version == 1  # the loop's turn has not come yet
    job = api.submit(job_text("print('hi')", queue="newcomers"))["id"]
    assert live.until(job, {JobState.SUCCEEDED}) is JobState.SUCCEEDED
    assert "newcomers" in live.loop.cluster.queues and "spare" in live.loop.cluster.nodes


def test_apply_cluster_validates_diffs_and_stores(live: Live, api: AllotmentClient) -> None:
    assert api.cluster() == {"version": None, "text": None, "sha256": None, "applied_at": None}

    dry = api.apply_cluster(BIGGER, dry_run=True)
    assert dry["dry_run"] and not dry["applied"] and dry["version"] is None
    assert dry["diff"]["nodes"] == {"added": ["spare"], "removed": [], "changed": [], "fields": {}}
    assert dry["diff"]["queues"] == {"added": [], "removed": [], "changed": [], "fields": {}}
    assert api.cluster()["version"] is None and live.applied == []

    done = api.apply_cluster(BIGGER)
    assert (done["applied"], done["version"]) == (True, 1)
    assert api.cluster()["text"] == BIGGER
    assert [sorted(c.nodes) for c in live.applied] == [["localhost", "spare"]]
    assert len(api.nodes()) == 2 and api.pools()[0]["gpu"]["capacity"] == 4

    again = api.apply_cluster(BIGGER)
    assert (again["applied"], again["version"]) == (False, 1)
    assert again["diff"]["nodes"]["added"] == []

    changed = BIGGER.replace("default_priority_class: experiment", "max_wait: 2h", 1)
    diff = api.apply_cluster(changed, dry_run=True)["diff"]
    assert (diff["queues"]["added"], diff["queues"]["changed"]) == ([], ["batch"])
    assert diff["queues"]["fields"] == {
        "batch": [
            {"path": "spec.default_priority_class", "old": "experiment", "new": None},
            {"path": "spec.max_wait", "old": None, "new": 7200.0},
        ]
    }
    unchanged = {"added": [], "removed": [], "changed": [], "fields": {}}
    assert diff["nodes"] == diff["pools"] == unchanged

    quota = "gpu: 1, cpu: 4, memory: 8Gi}}\n        default_priority_class: experiment"
    smaller = BIGGER.replace(quota, quota.replace("gpu: 1", "gpu: 0"))
    diff = api.apply_cluster(smaller, dry_run=True)["diff"]
    assert diff["queues"]["fields"] == {
        "batch": [{"path": "spec.quota.local.gpu", "old": "1", "new": "0"}]
    }


def test_apply_cluster_typo_names_key_and_line(live: Live, api: AllotmentClient) -> None:
    bad = "pools:\n  - name: a100\n    colour: blue\n"
    with pytest.raises(ClientError) as caught:
        api.apply_cluster(bad)
    error = caught.value
    assert (error.status, error.code) == (422, "invalid_config")
    [issue] = error.fields["issues"]
    assert issue["line"] == 3 and "colour" in issue["path"]
    assert api.cluster()["version"] is None and live.applied == []


def test_apply_cluster_refuses_to_change_the_executor(live: Live, api: AllotmentClient) -> None:
    slurm = (EXAMPLES / "cluster-slurm.yaml").read_text()
    with pytest.raises(ClientError) as caught:
        api.apply_cluster(slurm, dry_run=True)
    error = caught.value
    assert (error.status, error.code) == (422, "invalid_config")
    [issue] = error.fields["issues"]
    assert issue["path"] == "executor" and "restart allot up" in issue["message"]
    assert api.cluster()["version"] is None and live.applied == []


def test_logs_of_a_job_that_never_started_end(live: Live, api: AllotmentClient) -> None:
    job = api.submit(job_text("print(1)"))["id"]
    with live.sessions.begin() as db:
        transition_job(db, job, S.CANCELLED, at=time.time(), message="cancelled")
    chunk = api.logs(job)
    assert (chunk["attempt"], chunk["data"], chunk["eof"]) == (0, "", True)
