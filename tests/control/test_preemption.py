"""Preemption with real processes: the victim gets SIGTERM, then SIGKILL after the
loop's grace; it is requeued (never read as a user_code failure) and completes later."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.loop import ControlLoop
from allotment.domain.lifecycle import JobState
from allotment.store.jobs import cancel_job, events_for
from allotment.store.layout import log_path
from tests.control.conftest import (
    MakeLoop,
    Submit,
    attempts,
    loop_until,
    run_until,
    state_of,
    transitions,
    wait_until,
)

S = JobState

ON_TERM = {
    "exit": "lambda *_: (print('got SIGTERM', flush=True), sys.exit(0))",
    "ignore": "signal.SIG_IGN",
}


def victim_code(on_term: str) -> str:
    """Attempt 1 handles SIGTERM as told and sleeps; a later attempt exits 0 at once."""
    return (
        "import os, signal, sys, time\n"
        "if os.environ['ALLOTMENT_ATTEMPT'] == '1':\n"
        f"    signal.signal(signal.SIGTERM, {ON_TERM[on_term]})\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(30)\n"
    )


def start_borrower(
    loop: ControlLoop, sessions: sessionmaker[Session], submit: Submit, on_term: str
) -> str:
    """A batch job borrowing default's idle GPU (default's next job reclaims it)."""
    borrower = submit(victim_code(on_term), queue="batch", gpu=2)
    loop.cycle()
    assert run_until(loop, sessions, borrower, {S.RUNNING}) is S.RUNNING
    log = log_path(loop.work_root, "me", borrower, 1, "worker", 0, "out")
    wait_until(lambda: "ready" in log.read_text(), "the SIGTERM handler installed")
    return borrower


@pytest.mark.parametrize("on_term", ["exit", "ignore"])
def test_a_victim_is_stopped_requeued_and_completes_later(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit, on_term: str
) -> None:
    loop = make_loop()  # stop_grace_s=1
    borrower = start_borrower(loop, sessions, submit, on_term)
    owner = submit("print('mine')")
    preempted_at = time.monotonic()
    decisions = loop.cycle()
    [preemption] = decisions.preemptions
    assert [v.job for v in preemption.victims] == [borrower]
    assert state_of(sessions, borrower) is S.PREEMPTED

    loop_until(loop, lambda: attempts(sessions, borrower)[0].end_time is not None, "stopped")
    first = attempts(sessions, borrower)[0]
    log = log_path(loop.work_root, "me", borrower, 1, "worker", 0, "out")
    if on_term == "exit":
        assert (first.exit_code, first.signal) == (0, None)
        assert "got SIGTERM" in log.read_text()
    else:
        assert (first.exit_code, first.signal) == (None, signal.SIGKILL)
        assert time.monotonic() - preempted_at >= 0.9  # the grace was given
    assert (first.state, first.failure_class) == ("preempted", "preempted")

    assert run_until(loop, sessions, owner, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    assert run_until(loop, sessions, borrower, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    trail = transitions(sessions, borrower)
    assert "failed" not in trail
    assert trail[5:] == ["preempted", "pending", "admitted", "starting", "running", "succeeded"]
    with sessions() as db:
        [requeue] = [
            e
            for e in events_for(db, borrower)
            if (e.from_state, e.to_state) == ("preempted", "pending")
        ]
    assert requeue.message == "requeued after preemption"
    assert requeue.detail["preemptor"] == owner
    assert requeue.detail["cause"] == preemption.victims[0].cause
    assert requeue.detail["attempt"] == 1
    assert [a.number for a in attempts(sessions, borrower)] == [1, 2]
    assert loop.session.running == {}


def test_a_victim_cancelled_before_its_requeue_stays_cancelled(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    borrower = start_borrower(loop, sessions, submit, "ignore")
    submit("import time; time.sleep(0.5)")
    loop.cycle()
    assert state_of(sessions, borrower) is S.PREEMPTED
    with sessions.begin() as db:
        cancel_job(db, borrower, at=time.time())
    loop_until(loop, lambda: attempts(sessions, borrower)[0].end_time is not None, "stopped")
    assert state_of(sessions, borrower) is S.CANCELLED
    assert transitions(sessions, borrower)[-2:] == ["preempted", "cancelled"]
    assert borrower not in loop.session.running
    assert loop.session.pending_job(borrower) is None


def test_a_preemptor_waits_for_preemption_naming_its_victim_all_through_the_grace(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()  # stop_grace_s=1; the victim ignores SIGTERM, so it takes it all
    borrower = start_borrower(loop, sessions, submit, "ignore")
    owner = submit("print('mine')")
    [preemption] = loop.cycle().preemptions
    assert preemption.job == owner
    seen = []
    deadline = time.monotonic() + 10
    while attempts(sessions, borrower)[0].end_time is None:
        assert time.monotonic() < deadline, "the victim was not stopped"
        loop.observe()
        decisions = loop.cycle()
        if owner in decisions.waiting:
            seen.append(decisions.waiting[owner])
        time.sleep(0.1)
    assert len(seen) >= 3  # several cycles within the grace
    for reason in seen:
        assert reason.code.value == "waiting_for_preemption", reason
        assert reason.detail["victims"] == [borrower]
    assert run_until(loop, sessions, owner, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
