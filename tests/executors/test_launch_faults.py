"""Launch and supervision under faults: a launch cut short by a crash is completed by
the next launch, never taken for a replica that ran; a replica whose supervisor was
killed is ``lost`` but lingering until its processes are stopped, and only processes
proven to be its own are ever signalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from allotment.executors.base import LaunchRequest, ReplicaPhase
from allotment.executors.local import REPLICA_KEY_ENV, LocalExecutor
from allotment.executors.procfs import started
from allotment.executors.supervisor import read_json
from tests.executors.processes import kill_everything

PY = sys.executable


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[LocalExecutor]:
    ex = LocalExecutor(tmp_path / "state")
    yield ex
    kill_everything(tmp_path / "state")


def request(tmp_path: Path, code: str, job: str = "j-1") -> LaunchRequest:
    workdir = tmp_path / "work" / job
    workdir.mkdir(parents=True, exist_ok=True)
    return LaunchRequest(job_id=job, attempt=1, command=[PY, "-c", code], workdir=workdir)


def wait(done: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.05)


def output(executor: LocalExecutor, req: LaunchRequest) -> str:
    return (executor.replica_dir(req.key) / "stdout.log").read_text()


@pytest.mark.parametrize("left", ["directory", "temporary spec", "spec", "spec and lock"])
def test_fault_a_launch_cut_short_by_a_crash_is_completed_by_the_next(
    executor: LocalExecutor, tmp_path: Path, left: str
) -> None:
    req = request(tmp_path, "print('ran once')")
    directory = executor.replica_dir(req.key)
    directory.mkdir(parents=True)
    if left == "temporary spec":
        (directory / ".spec.json.999.tmp").write_text('{"job_id": "j-1", "att')
    if left in ("spec", "spec and lock"):
        (directory / "spec.json").write_text(json.dumps({"job_id": "j-1", "attempt": 1}))
    if left == "spec and lock":
        (directory / "supervisor.lock").write_text("")
    executor.launch(req)
    wait(lambda: executor.observe()[req.key].ended, "the replica ends")
    status = executor.observe()[req.key]
    assert status.phase is ReplicaPhase.EXITED and status.exit_code == 0
    assert output(executor, req) == "ran once\n"


def test_fault_a_second_launch_leaves_a_live_supervisor_alone(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    req = request(tmp_path, "import time; print('started', flush=True); time.sleep(30)")
    executor.launch(req)
    wait(lambda: executor.observe()[req.key].phase is ReplicaPhase.RUNNING, "running")
    launched = read_json(executor.replica_dir(req.key) / "launch.json")
    other = LocalExecutor(executor.state_root)  # a restarted server on the same root
    other.launch(req)
    executor.launch(req)
    assert read_json(executor.replica_dir(req.key) / "launch.json") == launched
    time.sleep(0.3)
    assert output(executor, req) == "started\n"


def test_fault_a_replica_that_ran_is_never_launched_again(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    req = request(tmp_path, "print('ran once')")
    executor.launch(req)
    wait(lambda: executor.observe()[req.key].ended, "the replica ends")
    LocalExecutor(executor.state_root).launch(req)
    time.sleep(0.5)
    assert output(executor, req) == "ran once\n"


def test_fault_a_supervisor_that_died_before_starting_anything_is_not_relaunched(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    # Its first act is to write state.json: a launch finding it leaves the replica to
    # observe(), which says lost, rather than running the program a second time.
    req = request(tmp_path, "print('ran')")
    directory = executor.replica_dir(req.key)
    directory.mkdir(parents=True)
    (directory / "spec.json").write_text(json.dumps({"job_id": "j-1", "attempt": 1}))
    (directory / "state.json").write_text(json.dumps({"supervisor_pid": 2**22 + 1}))
    executor.launch(req)
    assert not (directory / "stdout.log").exists()


def test_fault_a_killed_supervisors_replica_lingers_until_stopped(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    req = request(tmp_path, "import time; time.sleep(300)")
    executor.launch(req)
    wait(lambda: executor.observe()[req.key].phase is ReplicaPhase.RUNNING, "running")
    state = read_json(executor.replica_dir(req.key) / "state.json") or {}
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    wait(lambda: executor.observe()[req.key].phase is ReplicaPhase.LOST, "lost")
    status = executor.observe()[req.key]
    assert status.lingering and status.over and not status.ended
    assert "still run" in status.detail
    os.kill(state["pid"], 0)  # the program still runs: its devices are not free
    executor.stop(req.key, 1.0)
    wait(lambda: executor.observe()[req.key].ended, "the lingering replica is gone")
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)


def test_fault_a_supervisor_killed_before_recording_its_child_still_holds_the_replica(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    # The supervisor started its child and was SIGKILLed before it recorded the child's
    # group: the child runs on, found by the replica key in its environment, and is
    # lingering (its devices not free) until stopped. Unrelated processes are untouched.
    req = request(tmp_path, "print('x')")
    directory = executor.replica_dir(req.key)
    directory.mkdir(parents=True)
    spec = {"job_id": "j-1", "attempt": 1, "replica": req.key.replica, "index": 0}
    (directory / "spec.json").write_text(json.dumps(spec))
    os.utime(directory / "spec.json", (0, 0))
    (directory / "state.json").write_text(json.dumps({"supervisor_pid": 2**22 + 1}))
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    child = subprocess.Popen(
        sleep, env={**os.environ, REPLICA_KEY_ENV: str(req.key)}, start_new_session=True
    )
    other = replace(req.key, attempt=2)
    stranger = subprocess.Popen(
        sleep, env={**os.environ, REPLICA_KEY_ENV: str(other)}, start_new_session=True
    )
    try:
        wait(lambda: executor.observe()[req.key].lingering, "the unrecorded child is found")
        status = executor.observe()[req.key]
        assert status.phase is ReplicaPhase.LOST and not status.ended
        executor.stop(req.key, 0.0)
        assert child.wait(timeout=10) == -signal.SIGKILL
        wait(lambda: executor.observe()[req.key].ended, "nothing of the replica is left")
        assert stranger.poll() is None
    finally:
        for process in (child, stranger):
            process.kill()
            process.wait()


def test_fault_a_reused_group_number_is_never_taken_for_the_replica(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    # A replica whose supervisor and processes are gone; its group's number now belongs
    # to an unrelated process (started later), which must be neither counted nor killed.
    stranger = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        req = request(tmp_path, "print('x')")
        directory = executor.replica_dir(req.key)
        directory.mkdir(parents=True)
        spec = {"job_id": "j-1", "attempt": 1, "replica": "worker", "index": 0}
        (directory / "spec.json").write_text(json.dumps(spec))
        os.utime(directory / "spec.json", (0, 0))
        leader = started(stranger.pid)
        assert leader is not None
        recorded = {
            "supervisor_pid": 2**22 + 1,
            "pid": stranger.pid,
            "pgid": stranger.pid,
            "leader_started": leader - 1,  # the replica's leader started before
            "started_at": 1.0,
        }
        (directory / "state.json").write_text(json.dumps(recorded))
        status = executor.observe()[req.key]
        assert status.phase is ReplicaPhase.LOST and not status.lingering and status.ended
        executor.stop(req.key, 0.0)
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
