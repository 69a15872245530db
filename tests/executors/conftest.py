"""Fixtures for executor tests: real processes, every one of them killed in teardown."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from allotment.executors.base import ReplicaKey, ReplicaStatus
from allotment.executors.local import LocalExecutor
from tests.executors.processes import kill_everything


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
