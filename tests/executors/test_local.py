"""The local executor with real processes: launch, stop, observe, re-adoption, limits."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from allotment.domain.lifecycle import FailureClass
from allotment.executors.base import LaunchRequest, ReplicaPhase, ReplicaStatus
from allotment.executors.failures import classify
from allotment.executors.local import LocalExecutor
from tests.executors.conftest import Wait

PY = sys.executable


def ended(status: ReplicaStatus) -> bool:
    return status.ended


def running(status: ReplicaStatus) -> bool:
    return status.phase is ReplicaPhase.RUNNING


def python(code: str, tmp_path: Path, **kw: object) -> LaunchRequest:
    fields: dict[str, object] = {"job_id": "job-1", "attempt": 1, "workdir": tmp_path}
    fields.update(kw)
    return LaunchRequest(command=[PY, "-c", code], **fields)  # type: ignore[arg-type]


def stdout_of(ex: LocalExecutor, req: LaunchRequest) -> str:
    return (ex.replica_dir(req.key) / "stdout.log").read_text()


def test_devices_are_exported_as_cuda_visible_devices(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    code = "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    gpu = python(code, tmp_path, devices=(0, 1))
    cpu = python(code, tmp_path, index=1)
    executor.launch(gpu)
    executor.launch(cpu)
    assert wait_for(executor, gpu.key, ended).exit_code == 0
    assert wait_for(executor, cpu.key, ended).exit_code == 0
    assert stdout_of(executor, gpu).strip() == "'0,1'"
    assert stdout_of(executor, cpu).strip() == "''"


def test_exit_code_is_observed_and_classified_as_user_code(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    req = python("import sys; sys.stderr.write('boom'); sys.exit(3)", tmp_path)
    executor.launch(req)
    status = wait_for(executor, req.key, ended)
    assert (status.phase, status.exit_code, status.signal) == (ReplicaPhase.EXITED, 3, None)
    assert status.pid is not None and status.started_at is not None
    assert status.ended_at is not None and status.ended_at >= status.started_at
    assert classify(status) is FailureClass.USER_CODE
    assert (executor.replica_dir(req.key) / "stderr.log").read_text() == "boom"


def test_success_classifies_as_none(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    req = python("pass", tmp_path)
    executor.launch(req)
    assert classify(wait_for(executor, req.key, ended)) is None


def test_env_and_workdir_are_applied(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    code = "import os; print(os.getcwd()); print(os.environ['ALLOT_TEST'])"
    req = python(code, workdir, env={"ALLOT_TEST": "hello"})
    executor.launch(req)
    assert wait_for(executor, req.key, ended).exit_code == 0
    assert stdout_of(executor, req).split() == [str(workdir), "hello"]


def test_stop_sends_term_and_a_trapping_child_exits_cleanly(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    req = python(code, tmp_path)
    executor.launch(req)
    wait_for(executor, req.key, lambda s: running(s) and "ready" in stdout_of(executor, req))
    executor.stop(req.key, grace_s=5)
    status = wait_for(executor, req.key, ended)
    assert (status.phase, status.exit_code) == (ReplicaPhase.EXITED, 0)
    assert status.stop_requested
    assert classify(status, preempted=True) is FailureClass.PREEMPTED


def test_stop_kills_a_child_ignoring_term_after_grace(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    req = python(code, tmp_path)
    executor.launch(req)
    wait_for(executor, req.key, lambda s: running(s) and "ready" in stdout_of(executor, req))
    began = time.monotonic()
    executor.stop(req.key, grace_s=0.5)
    status = wait_for(executor, req.key, ended)
    assert time.monotonic() - began >= 0.5
    assert (status.phase, status.signal) == (ReplicaPhase.KILLED, signal.SIGKILL)
    assert not status.oom
    assert classify(status) is FailureClass.USER_CODE


def test_launching_the_same_key_twice_starts_one_process(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    marker = tmp_path / "starts"
    code = f"open({str(marker)!r}, 'a').write('x')"
    req = python(code, tmp_path)
    first = executor.launch(req)
    assert executor.launch(req) == first
    assert LocalExecutor(executor.state_root).launch(req) == first
    wait_for(executor, req.key, ended)
    assert marker.read_text() == "x"
    assert len(executor._children) == 1


def test_a_new_executor_readopts_running_and_finished_replicas(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    gate = tmp_path / "gate"
    code = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
        "sys.exit(7)\n"
    )
    req = python(code, tmp_path)
    executor.launch(req)
    first = wait_for(executor, req.key, running)
    restarted = LocalExecutor(executor.state_root)
    again = restarted.observe()[req.key]
    assert again.phase is ReplicaPhase.RUNNING and again.pid == first.pid
    gate.touch()
    status = wait_for(restarted, req.key, ended)
    assert (status.phase, status.exit_code) == (ReplicaPhase.EXITED, 7)


def test_supervisor_and_child_killed_is_lost(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    req = python("import time; time.sleep(30)", tmp_path)
    executor.launch(req)
    status = wait_for(executor, req.key, running)
    assert status.pid is not None
    supervisor = executor._children[req.key].pid
    os.killpg(status.pid, signal.SIGKILL)
    os.kill(supervisor, signal.SIGKILL)
    lost = wait_for(executor, req.key, ended)
    assert lost.phase is ReplicaPhase.LOST
    assert classify(lost) is FailureClass.NODE_FAILURE
    # A new instance, which never knew the supervisor, sees the same.
    assert LocalExecutor(executor.state_root).observe()[req.key].phase is ReplicaPhase.LOST


def test_max_runtime_ends_the_replica_as_timed_out(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    req = python("import time; time.sleep(30)", tmp_path, max_runtime=0.3, timeout_grace_s=1.0)
    executor.launch(req)
    status = wait_for(executor, req.key, ended)
    assert status.timed_out and status.signal == signal.SIGTERM
    assert classify(status) is FailureClass.TIMEOUT


def test_memory_limit_fails_a_child_that_allocates_too_much(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    # RLIMIT_AS: the allocation fails inside the child (MemoryError), it is not killed;
    # the supervisor reads the allocation failure in stderr and records oom.
    code = "x = bytearray(400 * 1024 * 1024)"
    req = python(code, tmp_path, memory_bytes=128 * 1024 * 1024)
    executor.launch(req)
    status = wait_for(executor, req.key, ended)
    assert (status.phase, status.exit_code) == (ReplicaPhase.EXITED, 1)
    assert status.oom
    assert classify(status) is FailureClass.OOM
    # The same program under a larger limit succeeds.
    free = python(code, tmp_path, index=1, memory_bytes=1024 * 1024 * 1024)
    executor.launch(free)
    assert wait_for(executor, free.key, ended).exit_code == 0


def test_a_command_that_cannot_start_is_exit_127(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    req = LaunchRequest(job_id="j", attempt=1, command=["/nonexistent/x"], workdir=tmp_path)
    executor.launch(req)
    status = wait_for(executor, req.key, ended)
    assert status.exit_code == 127 and "could not start" in status.detail


def test_stop_of_an_unknown_or_ended_replica_does_nothing(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait
) -> None:
    req = python("pass", tmp_path)
    executor.stop(req.key, grace_s=1)
    assert executor.observe() == {}
    executor.launch(req)
    wait_for(executor, req.key, ended)
    executor.stop(req.key, grace_s=1)
    assert executor.observe()[req.key].exit_code == 0
    assert not executor.observe()[req.key].stop_requested


def test_a_supervisor_that_records_its_end_and_exits_between_two_looks_is_not_lost(
    executor: LocalExecutor, tmp_path: Path, wait_for: Wait, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the crash-loop campaign: observe read the state file (no end yet), then
    the supervisor recorded the end and exited before observe checked it was alive. The
    replica ended normally; it must not be reported lost (a ``node_failure`` retry)."""
    gate = tmp_path / "gate"
    req = python(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)", tmp_path
    )
    executor.launch(req)
    wait_for(executor, req.key, running)
    observer = LocalExecutor(executor.state_root)  # never knew the supervisor
    alive = LocalExecutor._alive

    def end_then_look(self: LocalExecutor, key: object, pid: int) -> bool:
        gate.touch()  # the replica exits 0; its supervisor records it and exits
        deadline = time.monotonic() + 30
        while alive(self, key, pid) and time.monotonic() < deadline:  # type: ignore[arg-type]
            time.sleep(0.02)
        return False

    monkeypatch.setattr(LocalExecutor, "_alive", end_then_look)
    status = observer.observe()[req.key]
    assert (status.phase, status.exit_code) == (ReplicaPhase.EXITED, 0)
    assert classify(status) is None
