"""Issue 7's reclamation acceptance, tried as a new user would: ``allot up`` as a
process with the fake telemetry source (a readings file changed while it runs), and
the ``allot`` command for everything else."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from typing import Any

from tests.server.conftest import Up
from tests.server.test_acceptance import allot, allot_json, wait_for

# One node, two GPUs; notebooks idle below 5 % for 3 s are reclaimed, warned 1.5 s
# before; training jobs are exempt.
CLUSTER = """
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 2, cpu: 8, memory: 16Gi}}]
telemetry: {source: fake, file: gpus.json, interval: 0.2s, aggregate: 0.5s, retention: 1h}
queues:
  - name: all
    reaping:
      idle: {threshold: 5%, window: 3s, warn_before: 1.5s, exempt: [training]}
    children:
      - name: default
        quota: {local: {gpu: 2}}
"""

SLEEP = ["python3", "-c", "import time; time.sleep(120)"]


def job_file(up: Up, name: str, job_type: str) -> str:
    path = up.root / f"{name}.yaml"
    path.write_text(
        json.dumps(
            {
                "name": name,
                "queue": "default",
                "type": job_type,
                "replicas": [{"count": 1, "resources": {"gpu": 1}}],
                "command": SLEEP,
            }
        )
    )
    return str(path)


def device_of(up: Up, job_id: str) -> int:
    placement = allot_json(up, "why", job_id)["placement"]
    [replica] = placement["replicas"]
    [device] = replica["devices"]
    return int(device)


def set_readings(up: Up, readings: dict[str, Any]) -> None:
    path = up.root / "gpus.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(readings))
    tmp.replace(path)


def started(up: Up) -> Up:
    (up.root / "cluster.yaml").write_text(CLUSTER)
    set_readings(up, {})
    up.start("-f", str(up.root / "cluster.yaml"), "--reconcile-every", "1")
    return up


def test_an_idle_notebook_is_warned_then_reclaimed_and_its_gpu_goes_to_a_waiting_job(
    up: Up,
) -> None:
    started(up)
    busy = allot(up, "submit", job_file(up, "busy-notebook", "notebook")).stdout.strip()
    idle = allot(up, "submit", job_file(up, "idle-notebook", "notebook")).stdout.strip()
    exempt = allot(up, "submit", job_file(up, "trainer", "training")).stdout.strip()
    wait_for(up, busy, {"running"})
    wait_for(up, idle, {"running"})
    # The trainer waits for a GPU: both are held by the notebooks.
    assert allot_json(up, "get", exempt)["state"] == "pending"
    busy_gpu, idle_gpu = device_of(up, busy), device_of(up, idle)
    set_readings(
        up,
        {
            f"box/{busy_gpu}": {"utilization": 85, "memory": "3Gi"},
            f"box/{idle_gpu}": {"utilization": 1, "memory": "2Gi"},
        },
    )
    wait_for(up, idle, {"reclaimed"}, timeout=30)

    events = allot_json(up, "events", idle)
    kinds = [e["kind"] if e["kind"] != "transition" else e["to_state"] for e in events]
    assert "idle_warning" in kinds and kinds.index("idle_warning") < kinds.index("reclaimed")
    warning = next(e for e in events if e["kind"] == "idle_warning")
    reclaimed = next(e for e in events if e["to_state"] == "reclaimed")
    assert reclaimed["detail"]["reason"] == "idle"
    assert reclaimed["detail"]["samples"] and all(
        s["gpu_util_max"] < 5 for s in reclaimed["detail"]["samples"]
    )
    assert _seconds(reclaimed["at"]) - _seconds(warning["at"]) >= 1.5
    shown = allot_json(up, "get", idle)
    assert shown["failure_class"] == "reclaimed"

    # The waiting trainer gets the GPU the notebook held; the busy notebook runs on.
    wait_for(up, exempt, {"running"}, timeout=30)
    assert device_of(up, exempt) == idle_gpu
    assert allot_json(up, "get", busy)["state"] == "running"
    [record] = allot_json(up, "audit", "--action", "job.reap")["records"]
    assert record["user"] == "allotment" and record["object"] == idle
    assert record["detail"]["reason"] == "idle"

    # The trainer is idle too, but exempt; the busy notebook keeps its GPU.
    set_readings(
        up, {f"box/{busy_gpu}": {"utilization": 85}, f"box/{idle_gpu}": {"utilization": 0}}
    )
    time.sleep(5)
    assert allot_json(up, "get", exempt)["state"] == "running"
    assert allot_json(up, "get", busy)["state"] == "running"
    allot(up, "cancel", exempt)
    allot(up, "cancel", busy)


def _seconds(at: Any) -> float:
    if isinstance(at, int | float):
        return float(at)
    from datetime import datetime

    return datetime.fromisoformat(str(at).replace("Z", "+00:00")).timestamp()


def test_a_zombie_is_found_after_the_executor_loses_its_process(up: Up) -> None:
    started(up)
    job_id = allot(up, "run", "--", *SLEEP).stdout.strip()
    wait_for(up, job_id, {"running"})
    [directory] = (up.data_dir / "executor").glob(f"{job_id}/1/*")
    state = json.loads((directory / "state.json").read_text())
    shutil.rmtree(directory)  # the executor forgets the replica...
    for pgid in (state["supervisor_pid"], state["pgid"]):  # ...and its processes die
        os.killpg(pgid, signal.SIGKILL)

    job = wait_for(up, job_id, {"failed"}, timeout=20)
    assert job["failure_class"] == "node_failure"
    events = allot_json(up, "events", job_id)
    [zombie] = [e for e in events if e["kind"] == "zombie"]
    assert zombie["detail"]["attempt"] == 1
    assert list(zombie["detail"]["replicas"].values()) == [{"phase": "unknown to the executor"}]
    [record] = allot_json(up, "audit", "--action", "job.zombie")["records"]
    assert record["object"] == job_id and record["user"] == "allotment"
