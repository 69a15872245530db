"""Issue 4's acceptance, tried as a new user would: ``allot up`` as a process, and the
``allot`` command for everything else (a process each time, reading the config that
``allot up`` wrote)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.server.conftest import EXAMPLES, Up

PRINT_DEVICES = "import os; print('devices', os.environ['CUDA_VISIBLE_DEVICES'])"

# Two GPUs; queue `default` preempts by priority within itself and retries user errors;
# `batch` lends nothing, so `default` cannot grow past its one GPU.
CLUSTER = """
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 2, cpu: 8, memory: 16Gi}}]
queues:
  - name: all
    children:
      - name: default
        quota: {local: {gpu: 1}}
        preemption: {within_queue: lower_priority, reclaim: any}
        retry: {max_attempts: 2, on: [user_code, preempted], backoff: 1s}
      - name: batch
        quota: {local: {gpu: 1}}
        lending_limit: {local: {gpu: 0}}
"""


def allot(up: Up, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "allotment.cli.main", *args],
        env=up.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def allot_json(up: Up, *args: str) -> Any:
    return json.loads(allot(up, *args, "-o", "json").stdout)


def wait_for(up: Up, job_id: str, states: set[str], timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with up.client() as client:
            job = client.get_job(job_id)
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"{job_id} is {job.get('state')}, not {states}")


@pytest.fixture
def started(up: Up) -> Up:
    cluster = up.root / "cluster.yaml"
    cluster.write_text(CLUSTER)
    up.start("-f", str(cluster))
    return up


def test_run_prints_the_device_in_its_log(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    job_id = allot(up, "run", "--gpus", "1", "--", "python3", "-c", PRINT_DEVICES).stdout.strip()
    assert job_id.startswith("j-")
    wait_for(up, job_id, {"succeeded"})
    logs = allot(up, "logs", job_id).stdout
    assert logs.strip() in ("devices 0", "devices 1")
    events = [e["to_state"] for e in allot_json(up, "events", job_id) if e["to_state"]]
    assert events == ["submitted", "pending", "admitted", "starting", "running", "succeeded"]


def test_a_gang_of_two_runs_both_replicas_together(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    job = up.root / "gang.yaml"
    job.write_text(
        json.dumps(
            {
                "name": "gang",
                "queue": "default",
                "replicas": [{"name": "worker", "count": 2, "resources": {"gpu": 1}}],
                "command": [
                    "python3",
                    "-c",
                    "import os,time; print(os.environ['ALLOTMENT_REPLICA_INDEX'], "
                    "os.environ['CUDA_VISIBLE_DEVICES'], time.time())",
                ],
            }
        )
    )
    job_id = allot(up, "submit", str(job)).stdout.strip()
    wait_for(up, job_id, {"succeeded"})
    lines = [allot(up, "logs", job_id, "--replica", f"worker-{i}").stdout.split() for i in (0, 1)]
    assert [line[0] for line in lines] == ["0", "1"]
    assert {line[1] for line in lines} == {"0", "1"}  # one GPU each, two different GPUs
    assert abs(float(lines[0][2]) - float(lines[1][2])) < 5  # together


def test_a_job_beyond_its_queue_waits_and_why_names_the_quota(started: Up) -> None:
    up = started
    sleeper = ["--", "python3", "-c", "import time; time.sleep(30)"]
    first = allot(up, "run", "--max-runtime", "60s", *sleeper).stdout.strip()
    wait_for(up, first, {"running"})
    second = allot(up, "run", *sleeper).stdout.strip()
    deadline = time.monotonic() + 20
    why: dict[str, Any] = {}
    while time.monotonic() < deadline:
        why = allot_json(up, "why", second)
        if why.get("reason") and why["reason"]["code"] == "quota_exhausted":
            break
        time.sleep(0.2)
    assert why["state"] == "pending"
    detail = why["reason"]["detail"]
    assert (detail["queue"], detail["nominal"], detail["used"]) == ("default", 1, 1)
    assert detail["borrowable"] == 0
    assert why["estimated_start"] is not None  # when the first job's max_runtime ends
    assert [h["job"] for h in why["holders"]] == [first]
    human = " ".join(allot(up, "why", second).stdout.split())
    assert "quota" in human and "1 of 1 nominal used" in human
    allot(up, "cancel", first)
    allot(up, "cancel", second)


def test_a_higher_priority_job_preempts_a_lower_one_which_completes_later(started: Up) -> None:
    up = started
    sleep = ["--", "python3", "-c", "import time; time.sleep(3)"]
    busy = allot(up, "run", "--queue", "batch", *sleep).stdout.strip()
    low = allot(up, "run", "--priority-class", "experiment", *sleep).stdout.strip()
    wait_for(up, busy, {"running"})
    wait_for(up, low, {"running"})
    high = allot(up, "run", "--priority-class", "key-project", *sleep).stdout.strip()
    wait_for(up, high, {"running", "succeeded"})
    done = wait_for(up, low, {"succeeded", "failed"}, timeout=45)
    assert done["state"] == "succeeded" and done["attempt"] == 2
    events = allot_json(up, "events", low)
    moves = [e["to_state"] for e in events if e["to_state"]]
    assert "preempted" in moves and moves[-1] == "succeeded"
    preempted = next(e for e in events if e["to_state"] == "preempted")
    assert high in json.dumps(preempted)
    assert wait_for(up, high, {"succeeded"})["attempt"] == 1


def test_a_job_exiting_1_is_retried_then_fails_as_user_code(started: Up) -> None:
    up = started
    job_id = allot(up, "run", "--", "python3", "-c", "import sys; sys.exit(1)").stdout.strip()
    job = wait_for(up, job_id, {"failed"}, timeout=30)
    assert job["attempt"] == 2 and job["failure_class"] == "user_code"
    moves = [e["to_state"] for e in allot_json(up, "events", job_id) if e["to_state"]]
    assert moves.count("running") == 2 and moves.count("failed") == 2
    shown = allot_json(up, "get", job_id)
    assert shown["state"] == "failed" and shown["failure_class"] == "user_code"


def test_cli_errors_are_clear(started: Up) -> None:
    up = started
    bad = up.root / "typo.yaml"
    bad.write_text(
        "name: x\nqueue: default\nreplicas: [{count: 1, resources: {gpu: 1}}]\ncomand: [ls]\n"
    )
    done = allot(up, "submit", str(bad), check=False)
    assert done.returncode == 1 and "comand" in done.stderr and "line 4" in done.stderr
    assert "Traceback" not in done.stderr
    wrong = allot(up, "run", "--queue", "nope", "--", "true", check=False)
    assert wrong.returncode == 1 and "default" in wrong.stderr and "batch" in wrong.stderr
    missing = allot(up, "why", "j-doesnotexist", check=False)
    assert missing.returncode == 1 and "j-doesnotexist" in missing.stderr
    up.stop()
    down = allot(up, "ls", check=False)
    assert down.returncode == 1 and "allot up" in down.stderr
