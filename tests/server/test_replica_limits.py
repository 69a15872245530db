"""Replicas that ask for nothing still hold a CPU each, so a member cannot start more of
them than the node's CPUs; a queue caps the replicas of one job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from allotment.client import ClientError
from tests.server.conftest import EXAMPLES, Up
from tests.server.conftest import up as up

SLEEPER = 'name: s{i}\nqueue: default\ncommand: ["sleep", "30"]\nreplicas: [{{count: 1}}]\n'


def limited_cluster(root: Path) -> Path:
    """The one-workstation example (8 CPUs), its `batch` queue capped at 4 replicas."""
    text = (EXAMPLES / "cluster-local.yaml").read_text()
    text = text.replace(
        "default_priority_class: experiment\n",
        "default_priority_class: experiment\n        max_job_replicas: 4\n",
    )
    assert "max_job_replicas: 4" in text
    path = root / "cluster.yaml"
    path.write_text(text)
    return path


def test_fault_replicas_without_resources_are_bounded_by_cpus_and_the_queue(up: Up) -> None:
    up.start("-f", str(limited_cluster(up.root)))
    with up.client() as client:
        ids = [client.submit(SLEEPER.format(i=i))["id"] for i in range(10)]
        deadline = time.monotonic() + 40
        while True:
            jobs = [client.get_job(i) for i in ids]
            running = [j for j in jobs if j["state"] == "running"]
            if len(running) == 8 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(1.0)  # a few more cycles: nothing else starts
        states = [client.get_job(i)["state"] for i in ids]
        assert states.count("running") == 8, states  # one CPU each, 8 on the node
        waiting = [i for i, s in zip(ids, states, strict=True) if s == "pending"]
        assert len(waiting) == 2
        assert client.why(waiting[0])["reason"]["code"] in {"no_node_fits", "quota_exhausted"}

        # Thirty empty replicas in one job are 30 CPUs: more than the node has, ever.
        with pytest.raises(ClientError) as never:
            client.submit(
                "name: gang\nqueue: default\ncommand: [sleep, '1']\nreplicas: [{count: 30}]\n"
            )
        assert never.value.status == 422
        assert "30 replicas can never all run at once" in f"{never.value}"
        assert client.submit(
            "name: pair\nqueue: default\ncommand: [sleep, '1']\nreplicas: [{count: 2}]\n"
        )["spec"]["replicas"][0]["resources"] == {"cpu": "1"}

        with pytest.raises(ClientError) as refused:
            client.submit('name: wide\nqueue: batch\ncommand: ["true"]\nreplicas: [{count: 5}]\n')
        assert refused.value.status == 422
        assert "up to 4 replicas" in f"{refused.value} {refused.value.fields}"
        with pytest.raises(ClientError) as zero:
            client.submit(
                'name: z\nqueue: default\ncommand: ["true"]\nreplicas: [{resources: {cpu: 0}}]\n'
            )
        assert zero.value.status == 422
        assert "must ask for some cpu" in f"{zero.value} {zero.value.fields}"
        # Nothing refused was stored.
        names = {j["name"] for j in client.list_jobs()["jobs"]}
        assert names == {f"s{i}" for i in range(10)} | {"pair"}
        for job_id in ids:
            client.cancel(job_id)
