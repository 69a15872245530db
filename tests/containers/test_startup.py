"""``allot up`` with containers says what the host enforces, and refuses to start when
Podman is not there (rather than running jobs without isolation)."""

from __future__ import annotations

import signal

import pytest

from tests.containers.images import ensure_podman, missing
from tests.server.conftest import Up
from tests.server.conftest import up as up

CLUSTER = """
pools: [{{name: local}}]
nodes: [{{name: box, pool: local, capacity: {{gpu: 1, cpu: 2, memory: 4Gi}}}}]
queues: [{{name: default}}]
executor:
  runtime: {{kind: podman, podman: {podman}}}
"""


def test_without_podman_allot_up_stops_and_says_what_to_install(up: Up) -> None:
    cluster = up.root / "cluster.yaml"
    cluster.write_text(CLUSTER.format(podman="/nonexistent/podman"))
    process = up.start("-f", str(cluster), wait=False)
    _, err = process.communicate(timeout=60)
    assert process.returncode != 0
    text = err.decode()
    assert "is not ready for Allotment" in text
    assert "'/nonexistent/podman' is not installed" in text and "runtime.kind: process" in text
    assert "Traceback" not in text


@pytest.mark.skipif(bool(missing()), reason=f"containers need {missing()}")
def test_allot_up_prints_what_the_host_enforces(up: Up) -> None:
    ensure_podman()
    cluster = up.root / "cluster.yaml"
    cluster.write_text(CLUSTER.format(podman="podman"))
    process = up.start("-f", str(cluster))
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    text = err.decode()
    assert "executor:  local containers (Podman) on this machine" in text
    for aspect in ("image", "mounts", "network", "memory", "cpu", "identity", "devices"):
        assert f"    {aspect} " in text
    assert "memory    enforced by the cgroup" in text
    assert "identity  enforced: each tenant runs under its own uid" in text


def test_plain_processes_say_what_they_do_not_enforce(up: Up) -> None:
    cluster = up.root / "cluster.yaml"
    plain = CLUSTER.replace("runtime: {{kind: podman, podman: {podman}}}", "kind: local")
    cluster.write_text(plain.format())
    process = up.start("-f", str(cluster))
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    text = err.decode()
    assert "executor:  local processes on this machine" in text
    assert "identity  NOT enforced: every replica runs as the server's user" in text
