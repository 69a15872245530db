"""The control loop end to end: real store, real local executor, real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.loop import REASON_REFRESH_S
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.domain.reasons import Reason, ReasonCode
from allotment.executors.base import LaunchRequest
from allotment.store.jobs import events_for, get_job
from allotment.store.layout import log_path
from tests.control.conftest import (
    MakeLoop,
    Submit,
    attempts,
    executor_of,
    key_of,
    run_until,
    state_of,
    transitions,
)

S = JobState


class Crash(Exception):
    pass


PRINT_DEVICES = "import os; print('devices=' + os.environ['CUDA_VISIBLE_DEVICES'])"


def test_a_one_gpu_job_runs_to_success_with_its_device(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit(PRINT_DEVICES)
    decisions = loop.cycle()
    assert decisions.admitted_ids() == {job_id}
    assert state_of(sessions, job_id) is S.STARTING
    assert run_until(loop, sessions, job_id, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    [attempt] = attempts(sessions, job_id)
    [placement] = attempt.allocation
    assert attempt.number == 1 and attempt.pool == "local" and attempt.state == "succeeded"
    assert attempt.end_time is not None and attempt.exit_code == 0
    log = log_path(loop.work_root, "me", job_id, 1, "worker", 0, "out")
    assert log.read_text().strip() == f"devices={placement['devices'][0]}"
    assert transitions(sessions, job_id) == [
        "submitted",
        "pending",
        "admitted",
        "starting",
        "running",
        "succeeded",
    ]
    assert loop.session.running == {}  # resources given back


def test_a_job_exiting_1_fails_with_user_code(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import sys; sys.exit(1)")
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.SUCCEEDED, S.FAILED}) is S.FAILED
    with sessions() as db:
        assert get_job(db, job_id).failure_class == FailureClass.USER_CODE.value
    [attempt] = attempts(sessions, job_id)
    assert (attempt.exit_code, attempt.failure_class) == (1, "user_code")
    assert attempt.end_time is not None
    assert job_id not in loop.session.running


def test_a_gang_of_two_starts_both_replicas(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import time; time.sleep(1.5)", replicas=2)
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING, S.SUCCEEDED}) is S.RUNNING
    seen = executor_of(loop).observe()
    assert {key_of(job_id, 0), key_of(job_id, 1)} <= set(seen)
    [attempt] = attempts(sessions, job_id)
    devices = sorted(d for p in attempt.allocation for d in p["devices"])
    assert devices == [0, 1]
    assert run_until(loop, sessions, job_id, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED


def test_a_job_too_big_for_its_queue_waits_with_a_reason(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("print(1)", gpu=4)
    decisions = loop.cycle()
    assert job_id in decisions.waiting
    assert state_of(sessions, job_id) is S.PENDING
    with sessions() as db:
        job = get_job(db, job_id)
        assert job.reason_code == decisions.waiting[job_id].code.value
        assert job.reason_message
        reasons = [e for e in events_for(db, job_id) if e.kind == "reason"]
    loop.cycle()  # the same reason again writes nothing
    with sessions() as db:
        assert len([e for e in events_for(db, job_id) if e.kind == "reason"]) == len(reasons)
    assert attempts(sessions, job_id) == []


def test_a_changed_reason_is_written_though_the_last_one_is_remembered(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("print(1)", gpu=4)
    loop.cycle()
    first = loop._reasons[job_id][:2]
    with sessions.begin() as db:  # someone else changed the stored reason
        job = get_job(db, job_id)
        job.reason_code, job.reason_message = "other", "changed behind the loop's back"
    loop.cycle()  # the loop trusts what it wrote last: nothing read, nothing written
    with sessions() as db:
        assert get_job(db, job_id).reason_code == "other"
    loop.invalidate()  # a rebuilt session forgets, and writes the reason again
    loop.cycle()
    with sessions() as db:
        job = get_job(db, job_id)
        assert (job.reason_code, job.reason_message) == first


def test_a_message_under_the_same_code_is_rewritten_at_most_every_refresh(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("print(1)")
    code = ReasonCode.BEHIND_HIGHER_PRIORITY

    def record(message: str, at: float, code: ReasonCode = code) -> str | None:
        with sessions.begin() as db:
            loop._record_waiting(db, {job_id: Reason(code, message)}, at)
        with sessions() as db:
            return get_job(db, job_id).reason_message

    assert record("behind j-1", 100.0) == "behind j-1"
    assert record("behind j-2", 101.0) == "behind j-1"  # same code, too soon
    assert record("out of quota", 102.0, ReasonCode.QUOTA_EXHAUSTED) == "out of quota"
    assert record("behind j-3", 103.0) == "behind j-3"  # the code changed: at once
    assert record("behind j-4", 103.0 + REASON_REFRESH_S) == "behind j-4"


def test_a_new_loop_re_adopts_a_running_job_after_a_crash(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    first = make_loop()
    job_id = submit("import time; time.sleep(2)")
    first.cycle()
    assert run_until(first, sessions, job_id, {S.RUNNING, S.SUCCEEDED}) is S.RUNNING
    del first  # the crash

    second = make_loop()
    assert job_id in second.rebuild().running
    assert second.reconcile() == []
    assert second.cycle().admitted == []
    assert run_until(second, sessions, job_id, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    assert [a.number for a in attempts(sessions, job_id)] == [1]
    replica_dirs = list(executor_of(second).state_root.glob("*/*/*/spec.json"))
    assert len(replica_dirs) == 1
    assert transitions(sessions, job_id).count("starting") == 1


def test_a_crash_between_commit_and_launch_is_repaired(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    first = make_loop()
    job_id = submit("print('late')")

    def crash(_request: object) -> str:
        raise Crash  # not an OSError: the loop dies after its commit, before launching

    executor_of(first).launch = crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        first.cycle()
    assert state_of(sessions, job_id) is S.ADMITTED

    second = make_loop()
    assert second.reconcile() == []
    assert state_of(sessions, job_id) is S.STARTING
    assert run_until(second, sessions, job_id, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    assert [a.number for a in attempts(sessions, job_id)] == [1]


def test_reconcile_marks_a_job_whose_replica_vanished_a_zombie(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import time; time.sleep(30)")
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING}) is S.RUNNING
    directory = executor_of(loop).replica_dir(key_of(job_id))
    state = json.loads((directory / "state.json").read_text())
    for pgid in (state["supervisor_pid"], state["pgid"]):
        os.killpg(pgid, signal.SIGKILL)
    shutil.rmtree(directory)

    assert loop.reconcile() == []
    assert state_of(sessions, job_id) is S.FAILED
    with sessions() as db:
        assert get_job(db, job_id).failure_class == FailureClass.NODE_FAILURE.value
    [attempt] = attempts(sessions, job_id)
    assert attempt.end_time is not None
    assert job_id not in loop.session.running


def test_reconcile_marks_a_job_whose_supervisor_was_killed_a_zombie(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import time; time.sleep(30)")
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING}) is S.RUNNING
    directory = executor_of(loop).replica_dir(key_of(job_id))
    state = json.loads((directory / "state.json").read_text())
    os.killpg(state["supervisor_pid"], signal.SIGKILL)
    os.killpg(state["pgid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while executor_of(loop).observe()[key_of(job_id)].phase.value != "lost":
        assert time.monotonic() < deadline
        time.sleep(0.05)

    assert loop.reconcile() == []
    with sessions() as db:
        job = get_job(db, job_id)
        assert (job.state, job.failure_class) == ("failed", "node_failure")


def test_replicas_the_store_does_not_know_are_orphans_left_running(
    make_loop: MakeLoop, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    loop = make_loop()
    request = LaunchRequest(
        job_id="stranger",
        attempt=1,
        command=[sys.executable, "-c", "import time; time.sleep(30)"],
        workdir=tmp_path,
    )
    executor_of(loop).launch(request)
    assert loop.reconcile() == [request.key]
    assert not executor_of(loop).observe()[request.key].ended


def test_reclaim_preempts_a_borrower_which_is_requeued(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    borrower = submit("import time; time.sleep(30)", queue="batch", gpu=2)
    loop.cycle()
    assert run_until(loop, sessions, borrower, {S.RUNNING}) is S.RUNNING
    owner = submit("print('mine')")
    decisions = loop.cycle()
    assert [v.job for p in decisions.preemptions for v in p.victims] == [borrower]
    assert state_of(sessions, borrower) is S.PREEMPTED

    assert run_until(loop, sessions, owner, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    assert state_of(sessions, borrower) in {S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING}
    assert transitions(sessions, borrower)[:7] == [
        "submitted",
        "pending",
        "admitted",
        "starting",
        "running",
        "preempted",
        "pending",
    ]
    first = attempts(sessions, borrower)[0]
    assert first.failure_class == "preempted" and first.end_time is not None


def test_a_job_committed_as_a_turn_begins_is_never_admitted_before_its_submission(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    """The turn's clock is read after the store: a job stored while the turn began
    (here: just before the turn reads the store) gets an admission stamped after it."""
    loop = make_loop()
    read = loop._sync_pending
    made: list[str] = []

    def stored_meanwhile(session: object) -> None:
        made.append(submit(PRINT_DEVICES))
        read(session)  # type: ignore[arg-type]

    loop._sync_pending = stored_meanwhile  # type: ignore[method-assign]
    loop.cycle()
    [job_id] = made
    with sessions() as db:
        submitted = get_job(db, job_id).submit_time
        [admitted] = [e.at for e in events_for(db, job_id) if e.to_state == "admitted"]
    assert admitted >= submitted
