"""Killing the server with SIGKILL mid-run loses no job and double-books no GPU."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.server.conftest import EXAMPLES, Up

SCRIPT = """
import json, os, sys, time
out = sys.argv[1]
start = time.time()
time.sleep(float(sys.argv[2]))
with open(out, "w") as f:
    json.dump({"devices": os.environ["CUDA_VISIBLE_DEVICES"], "start": start,
               "end": time.time(), "pid": os.getpid()}, f)
"""


def job_file(name: str, record: Path, seconds: float) -> str:
    command = ["python3", "-c", SCRIPT, str(record), str(seconds)]
    return json.dumps(
        {
            "name": name,
            "queue": "default",
            "replicas": [{"count": 1, "resources": {"gpu": 1, "cpu": 1, "memory": "1Gi"}}],
            "command": command,
        }
    )


def states(up: Up, ids: list[str]) -> dict[str, str]:
    with up.client() as client:
        return {i: client.get_job(i)["state"] for i in ids}


def wait_until(predicate: object, timeout: float = 40.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_sigkill_mid_run_loses_no_job_and_double_books_no_gpu(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))  # 2 GPUs
    records = up.root / "records"
    records.mkdir()
    with up.client() as client:
        ids = [
            client.submit(job_file(f"j{i}", records / f"j{i}.json", 3.0))["id"] for i in range(4)
        ]
    wait_until(lambda: list(states(up, ids).values()).count("running") == 2)
    up.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    up.process.wait(timeout=10)  # type: ignore[union-attr]
    time.sleep(1.0)  # the replicas run on without the server
    up.start()
    wait_until(lambda: set(states(up, ids).values()) == {"succeeded"}, timeout=60)
    runs = [json.loads((records / f"j{i}.json").read_text()) for i in range(4)]
    assert len({r["pid"] for r in runs}) == 4  # each job ran once: nothing relaunched
    # No device held by two jobs at once, and never more than 2 jobs at a time.
    for a in runs:
        for b in runs:
            if a is not b and a["devices"] == b["devices"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
        overlapping = [b for b in runs if b["start"] < a["end"] and a["start"] < b["end"]]
        assert len(overlapping) <= 2
    with up.client() as client:
        for job_id in ids:
            assert client.get_job(job_id)["attempt"] == 1
