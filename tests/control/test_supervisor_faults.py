"""A killed supervisor must not free its replica's GPUs while the replica still runs:
the job fails (``node_failure``), the lingering processes are stopped by their recorded
process group, and only once they are gone does the next job get the devices."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from allotment.api import explain
from allotment.domain.lifecycle import JobState as S
from allotment.store.jobs import cancel_job, events_for, get_job
from tests.control.conftest import (
    MakeLoop,
    Submit,
    attempts,
    executor_of,
    key_of,
    run_until,
    state_of,
    wait_until,
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_fault_killed_supervisor_keeps_its_gpus_taken_until_its_replica_is_gone(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    first = submit("import time; time.sleep(300)", gpu=2)
    loop.cycle()
    run_until(loop, sessions, first, {S.RUNNING})
    second = submit("print('second')", gpu=2)
    loop.cycle()
    assert state_of(sessions, second) is S.PENDING
    state = json.loads((executor_of(loop).replica_dir(key_of(first)) / "state.json").read_text())
    program = state["pid"]
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: executor_of(loop).observe()[key_of(first)].phase.value == "lost", "lost")
    deadline = time.monotonic() + 15
    while state_of(sessions, second) not in (S.RUNNING, S.SUCCEEDED):
        assert time.monotonic() < deadline, "the second job never ran"
        loop.observe()
        loop.cycle()
        if attempts(sessions, second):
            # The GPUs went to the second job: the first one's program must be gone.
            assert not alive(program), "devices handed out while the lost replica still ran"
        time.sleep(0.05)
    job = state_of(sessions, first)
    assert job is S.FAILED
    with sessions() as db:
        assert get_job(db, first).failure_class == "node_failure"
    assert not alive(program)


def test_fault_cancel_stops_a_lost_replica_that_still_runs(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import time; time.sleep(300)", gpu=1)
    loop.cycle()
    run_until(loop, sessions, job_id, {S.RUNNING})
    state = json.loads((executor_of(loop).replica_dir(key_of(job_id)) / "state.json").read_text())
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: executor_of(loop).observe()[key_of(job_id)].phase.value == "lost", "lost")
    with sessions.begin() as db:
        cancel_job(db, job_id, at=time.time(), by="me")
    wait_until(lambda: (loop.observe(), not alive(state["pid"]))[1], "the program is stopped")
    loop.observe()
    assert executor_of(loop).observe()[key_of(job_id)].ended
    assert state_of(sessions, job_id) is S.CANCELLED
    assert attempts(sessions, job_id)[0].end_time is not None  # its resources are free


def test_fault_a_command_that_does_not_exist_says_why_in_events_and_logs(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit, tmp_path: Path
) -> None:
    loop = make_loop()
    job_id = submit("", fields={"command": ["/nonexistent/allotment-train"]}, gpu=0)
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.FAILED}) is S.FAILED
    with sessions() as db:
        [ended] = [e for e in events_for(db, job_id) if e.to_state == S.FAILED.value]
    assert "exit code 127" in ended.message
    with sessions() as db:
        assert get_job(db, job_id).failure_class == "launch"
        why = explain.why(db, loop.cluster, job_id, now=time.time())
    assert why.reason is not None and why.reason.code == "launch"
    assert "could not start the command" in why.reason.message
    assert "could not start the command" in ended.message and "allotment-train" in ended.message
    [err] = (tmp_path / "work").glob(f"me/{job_id}/1/logs/worker-0.err")
    assert "could not start the command" in err.read_text()
