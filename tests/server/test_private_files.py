"""The store and the replicas' specs (their environment, secrets included) are the
server user's alone: the data directory and the executor's 0700, files 0600."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from tests.server.conftest import EXAMPLES, Up
from tests.server.conftest import up as up


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_reliab_the_store_and_the_specs_are_private(up: Up) -> None:
    old = os.umask(0o022)
    try:
        up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    finally:
        os.umask(old)
    with up.client() as client:
        job = client.submit(
            'name: t\nqueue: default\ncommand: ["true"]\nenv: {API_KEY: s3cr3t}\n'
            "replicas: [{count: 1, resources: {gpu: 1}}]\n"
        )["id"]
        deadline = time.monotonic() + 30
        while client.get_job(job)["state"] != "succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert mode(up.data_dir) == 0o700
    assert mode(up.data_dir / "allotment.db") == 0o600
    assert mode(up.data_dir / "executor") == 0o700
    [spec] = list((up.data_dir / "executor").glob("*/*/*/spec.json"))
    assert "s3cr3t" in spec.read_text() and mode(spec) == 0o600
    for name in ("state.json", "launch.json"):
        assert mode(spec.with_name(name)) == 0o600
