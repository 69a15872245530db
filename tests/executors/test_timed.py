"""The timed executor: replicas that run for their declared time and exit 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from allotment.executors.base import GpuInfo, LaunchRequest, ReplicaKey, ReplicaPhase
from allotment.executors.timed import RUNTIME_ENV, TimedExecutor


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def request(job: str = "j-1", *, runtime: str | None = None, attempt: int = 1) -> LaunchRequest:
    env = {RUNTIME_ENV: runtime} if runtime is not None else {}
    return LaunchRequest(
        job_id=job, attempt=attempt, command=["true"], env=env, workdir=Path("unused")
    )


def test_runs_for_its_runtime_then_exits_zero() -> None:
    clock = Clock()
    ex = TimedExecutor(clock=clock)
    key = request().key
    assert ex.launch(request(runtime="2.5")) == str(key)
    status = ex.observe()[key]
    assert status.phase is ReplicaPhase.RUNNING
    assert status.started_at == 1_000.0
    clock.now = 1_002.4
    assert ex.observe()[key].phase is ReplicaPhase.RUNNING
    clock.now = 1_010.0
    status = ex.observe()[key]
    assert status.phase is ReplicaPhase.EXITED
    assert status.exit_code == 0
    assert status.ended_at == 1_002.5  # start + runtime, not the time it was seen
    assert status.ended and not status.stop_requested


def test_default_runtime_when_the_env_is_missing_or_bad() -> None:
    clock = Clock()
    ex = TimedExecutor(clock=clock, default_runtime_s=3.0)
    ex.launch(request("a"))
    ex.launch(request("b", runtime="soon"))
    ex.launch(request("c", runtime="-1"))
    ex.launch(request("d", runtime="nan"))
    clock.now = 1_003.0
    assert {k.job_id: s.ended_at for k, s in ex.observe().items()} == {
        "a": 1_003.0,
        "b": 1_003.0,
        "c": 1_003.0,
        "d": 1_003.0,
    }


def test_zero_runtime_ends_at_once() -> None:
    ex = TimedExecutor(clock=Clock())
    ex.launch(request(runtime="0"))
    assert ex.observe()[request().key].phase is ReplicaPhase.EXITED


def test_launch_is_idempotent_per_key() -> None:
    clock = Clock()
    ex = TimedExecutor(clock=clock)
    ex.launch(request(runtime="5"))
    clock.now = 1_004.0
    ex.launch(request(runtime="1"))  # a repeat: the first launch stands
    assert ex.launches == 1
    assert ex.observe()[request().key].phase is ReplicaPhase.RUNNING
    ex.launch(request(runtime="1", attempt=2))  # another attempt is another replica
    assert ex.launches == 2
    assert len(ex.observe()) == 2


def test_stop_kills_with_sigterm() -> None:
    clock = Clock()
    ex = TimedExecutor(clock=clock)
    key = request().key
    ex.launch(request(runtime="10"))
    clock.now = 1_004.0
    ex.stop(key, grace_s=30.0)
    ex.stop(key, grace_s=30.0)  # idempotent
    clock.now = 1_020.0
    status = ex.observe()[key]
    assert status.phase is ReplicaPhase.KILLED
    assert status.signal == signal.SIGTERM
    assert status.stop_requested
    assert status.ended_at == 1_004.0
    assert status.exit_code is None


def test_stop_after_the_end_or_of_an_unknown_replica_changes_nothing() -> None:
    clock = Clock()
    ex = TimedExecutor(clock=clock)
    key = request().key
    ex.launch(request(runtime="1"))
    clock.now = 1_002.0
    ex.stop(key, grace_s=1.0)
    assert ex.observe()[key].phase is ReplicaPhase.EXITED
    ex.stop(ReplicaKey("nobody", 1, "worker", 0), grace_s=1.0)
    assert list(ex.observe()) == [key]


def test_inventory_is_what_was_declared() -> None:
    assert TimedExecutor().inventory() == []
    gpus = [GpuInfo(index=0), GpuInfo(index=1)]
    assert TimedExecutor(devices=gpus).inventory() == gpus


def test_negative_default_is_refused() -> None:
    with pytest.raises(ValueError):
        TimedExecutor(default_runtime_s=-1)


def test_concurrent_launches_each_count_once() -> None:
    ex = TimedExecutor(clock=Clock())
    requests = [request(f"j-{i}", runtime="1") for i in range(200)]

    def launch_all() -> None:
        for r in requests:
            ex.launch(r)

    threads = [threading.Thread(target=launch_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ex.launches == 200
    assert len(ex.observe()) == 200


def test_told_where_it_sends_wake_as_each_replica_ends() -> None:
    """As a supervisor does when its replica ends: a ``wake`` message, at the end."""
    from allotment.control.wake import WakeListener

    woken: list[float] = []
    listener = WakeListener(
        lambda kind, _: woken.append(time.monotonic()) if kind == "wake" else None
    )
    listener.start()
    try:
        ex = TimedExecutor()
        ex.wake_on_end(listener.port, listener.secret)
        launched = time.monotonic()
        ex.launch(request("j-1", runtime="0.3"))
        ex.launch(request("j-2", runtime="0.6"))
        deadline = time.monotonic() + 10
        while len(woken) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(woken) == 2
        assert woken[0] - launched >= 0.25 and woken[1] - launched >= 0.55
    finally:
        listener.stop()
