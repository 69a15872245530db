"""Cancellation as the control loop sees it: real store, real local executor, real
processes."""

from __future__ import annotations

import signal
import time
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from allotment.domain.lifecycle import JobState
from allotment.scheduler.decisions import Decisions
from allotment.store.jobs import cancel_job
from allotment.store.layout import log_path
from tests.control.conftest import (
    MakeLoop,
    Submit,
    attempts,
    executor_of,
    key_of,
    loop_until,
    run_until,
    state_of,
    transitions,
    wait_until,
)

S = JobState


def cancel(sessions: sessionmaker[Session], job_id: str) -> None:
    with sessions.begin() as db:
        cancel_job(db, job_id, at=time.time(), by="me")


def test_a_pending_job_cancelled_leaves_the_session_and_never_runs(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("print(1)", gpu=4)  # too big for its queue: waits
    loop.cycle()
    assert loop.session.pending_job(job_id) is not None
    cancel(sessions, job_id)
    loop.cycle()
    assert loop.session.pending_job(job_id) is None
    assert state_of(sessions, job_id) is S.CANCELLED
    assert attempts(sessions, job_id) == []


def test_a_running_job_cancelled_is_stopped_and_its_resources_freed(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import time; time.sleep(30)", gpu=2, queue="batch")
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING}) is S.RUNNING
    cancel(sessions, job_id)
    loop.observe()
    assert loop.session.running[job_id].terminating  # stopping at once

    waiting = submit("print('next')", gpu=2, queue="batch")
    loop_until(loop, lambda: attempts(sessions, job_id)[0].end_time is not None, "closed")
    [attempt] = attempts(sessions, job_id)
    assert (attempt.state, attempt.failure_class) == ("cancelled", "cancelled")
    assert attempt.signal == signal.SIGTERM
    assert executor_of(loop).observe()[key_of(job_id)].stop_requested
    assert job_id not in loop.session.running
    assert state_of(sessions, job_id) is S.CANCELLED
    assert transitions(sessions, job_id)[-2:] == ["running", "cancelled"]
    # the freed GPUs go to the next job
    assert run_until(loop, sessions, waiting, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()  # stop_grace_s=1
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    job_id = submit(code)
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING}) is S.RUNNING
    log = log_path(loop.work_root, "me", job_id, 1, "worker", 0, "out")
    wait_until(lambda: "ready" in log.read_text(), "the handler installed")
    cancel(sessions, job_id)
    started = time.monotonic()
    loop_until(loop, lambda: attempts(sessions, job_id)[0].end_time is not None, "closed")
    assert time.monotonic() - started >= 0.9
    [attempt] = attempts(sessions, job_id)
    assert attempt.signal == signal.SIGKILL
    assert state_of(sessions, job_id) is S.CANCELLED


def test_a_cancel_racing_a_cycle_voids_the_admission_and_keeps_the_rest(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    doomed = submit("print('never')")
    other = submit("print('other')", queue="batch")
    session = loop.session

    class CancelAfterDeciding:
        """The loop's scheduler session, but the cancel lands between its next decision
        and that decision's transaction. (A wrapper: a compiled core's methods cannot be
        replaced on the instance.)"""

        def __getattr__(self, name: str) -> Any:
            return getattr(session, name)

        def cycle(self, now: float, *, explain: bool = True) -> Decisions:
            decisions = session.cycle(now, explain=explain)
            cancel(sessions, doomed)
            return decisions

    loop._session = CancelAfterDeciding()  # type: ignore[assignment]
    decisions = loop.cycle()
    loop._session = session
    assert decisions.admitted_ids() == {doomed, other}
    assert state_of(sessions, doomed) is S.CANCELLED
    assert attempts(sessions, doomed) == []
    assert doomed not in loop.session.running  # its resources are free again
    assert state_of(sessions, other) is S.STARTING
    assert run_until(loop, sessions, other, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    assert executor_of(loop).observe().get(key_of(doomed)) is None  # never launched
