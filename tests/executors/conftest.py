"""Fixtures for executor tests: real processes, every one of them killed in teardown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from allotment.executors.base import ReplicaKey, ReplicaStatus
from allotment.executors.local import LocalExecutor


def kill_everything(root: Path) -> None:
    """SIGKILL every supervisor (its own group) and every replica group under ``root``."""
    for name in ("launch.json", "state.json"):
        for path in root.glob(f"*/*/*/{name}"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for field in ("supervisor_pid", "pgid"):
                pgid = data.get(field)
                if isinstance(pgid, int):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def state_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "state"
    yield root
    kill_everything(root)


@pytest.fixture
def executor(state_root: Path) -> Iterator[LocalExecutor]:
    ex = LocalExecutor(state_root)
    yield ex
    kill_everything(state_root)
    for child in ex._children.values():
        with contextlib.suppress(Exception):
            child.wait(timeout=5)


Wait = Callable[..., ReplicaStatus]


@pytest.fixture
def wait_for() -> Wait:
    def wait(
        ex: LocalExecutor,
        key: ReplicaKey,
        check: Callable[[ReplicaStatus], bool],
        timeout: float = 8.0,
    ) -> ReplicaStatus:
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            status = ex.observe().get(key)
            if status is not None and check(status):
                return status
            time.sleep(0.02)
        raise AssertionError(f"{key}: condition not met, last status {status}")

    return wait
