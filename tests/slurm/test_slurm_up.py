"""``allot up`` on a real Slurm cluster, as a user runs it: the nodes come from Slurm,
jobs run there, logs come back, a killed server re-adopts what runs, and a Slurm set up
wrongly stops the start with what to change."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable

from tests.server.conftest import Up
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import cluster_yaml

JOB = """
name: {name}
queue: research
replicas: [{{count: {replicas}, resources: {{gpu: {gpu}, cpu: 1, memory: 100Mi}}}}]
pools: [a100]
command: [sh, -c, {command}]
"""


def wait_until(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what}")
        time.sleep(0.2)


def test_allot_up_runs_jobs_on_slurm_and_readopts_them_after_a_kill(
    up: Up, clean: SlurmCluster
) -> None:
    config = up.root / "cluster.yaml"
    config.write_text(cluster_yaml(clean.bin_dir))
    up.start("-f", str(config))
    with up.client() as client:
        nodes = {n["name"]: n for n in client.nodes()}
        assert set(nodes) == {"gpu-node1", "gpu-node2", "gpu-node3"}
        assert nodes["gpu-node3"]["pool"] == "h100"
        command = json.dumps('echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"; sleep 3')
        job = client.submit(JOB.format(name="gang", replicas=2, gpu=4, command=command))["id"]
        wait_until(lambda: client.get_job(job)["state"] == "running", "the gang runs")
    up.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    up.process.wait(timeout=10)  # type: ignore[union-attr]
    up.start()
    with up.client() as client:
        wait_until(lambda: client.get_job(job)["state"] == "succeeded", "the gang succeeds")
        chunk = client.logs(job, replica="worker-1")
        assert chunk["data"].split()[1] == "0,1,2,3"
        assert client.get_job(job)["attempt"] == 1
    names = [j["name"] for j in json.loads(clean.run("squeue", "--json").stdout)["jobs"]]
    assert names.count(f"allot-{job}-1") == 1


def test_allot_up_refuses_a_slurm_that_would_reorder_its_decisions(
    up: Up, clean: SlurmCluster
) -> None:
    config = up.root / "cluster.yaml"
    config.write_text(cluster_yaml(clean.bin_dir).replace("partition: gpu", "partition: nowhere"))
    process = up.start("-f", str(config), wait=False)
    _, err = process.communicate(timeout=60)
    assert process.returncode != 0
    text = err.decode()
    assert "Slurm is not ready for Allotment" in text
    assert "partition does not exist" in text
    assert "Traceback" not in text
