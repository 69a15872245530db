"""A full disk under the store is a 503 that says so, changes nothing, and passes once
space is freed: a real SQLite store on a small tmpfs, filled up."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from allotment.api.app import create_app
from allotment.api.errors import storage_full
from allotment.client import AllotmentClient, ClientError
from allotment.domain.loading import load_cluster
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import EXAMPLES, FakeClock, serve

SPEC = 'name: t\nqueue: default\ncommand: ["true"]\nreplicas: [{count: 1, resources: {gpu: 1}}]\n'


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(path: Path) -> None:
    with path.open("wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()


def test_fault_a_full_disk_is_a_503_that_changes_nothing_and_recovers(small_disk: Path) -> None:
    engine = make_engine(f"sqlite:///{small_disk / 'a.db'}")
    migrate.upgrade(engine)
    app = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
    )
    try:
        with serve(app) as url, AllotmentClient(url, timeout=20) as client:
            first = client.submit(SPEC)["id"]
            filler = small_disk / "filler"
            fill(filler)
            refused = 0
            for _ in range(20):  # until SQLite's own pages run out too
                try:
                    client.submit(SPEC)
                except ClientError as exc:
                    assert exc.status == 503 and exc.code == "storage_full", exc
                    assert "disk is full" in exc.message
                    refused += 1
                    break
            assert refused == 1
            filler.unlink()
            second = client.submit(SPEC)["id"]
            ids = [j["id"] for j in client.list_jobs()["jobs"]]
            assert ids[0] == first and ids[-1] == second
            assert httpx.get(f"{url}/api/v1/healthz").status_code == 200
    finally:
        engine.dispose()


def test_fault_storage_full_is_recognised_on_both_stores() -> None:
    assert storage_full(OSError(28, "No space left on device"))
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = Exception("(sqlite3.OperationalError) database or disk is full")
    assert storage_full(wrapped)

    class DiskFull(Exception):
        sqlstate = "53100"

    assert storage_full(DiskFull("could not write"))
    assert not storage_full(RuntimeError("something else"))
