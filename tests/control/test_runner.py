"""The loop runner: turns on wake-ups and ticks, survives a failing turn."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session, sessionmaker

from allotment.control.runner import LoopRunner
from allotment.domain.lifecycle import JobState
from tests.control.conftest import MakeLoop, Submit, state_of


def wait_for(predicate: object, timeout: float = 15.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_the_runner_runs_submitted_jobs_to_the_end(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    runner = LoopRunner(make_loop(), tick_s=0.2)
    runner.start()
    try:
        job_id = submit("print('hi')")
        runner.wake()
        wait_for(lambda: state_of(sessions, job_id) is JobState.SUCCEEDED)
        assert runner.failures == 0 and runner.turns > 0
    finally:
        runner.stop()
    assert not runner.alive


def test_a_failing_turn_is_counted_and_the_next_one_rebuilds(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    real_cycle = loop.cycle
    calls = {"n": 0}

    def flaky() -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_cycle()

    loop.cycle = flaky  # type: ignore[method-assign,assignment]
    runner = LoopRunner(loop, tick_s=0.1)
    runner.start()
    try:
        job_id = submit("print('hi')")
        wait_for(lambda: state_of(sessions, job_id) is JobState.SUCCEEDED)
    finally:
        runner.stop()
    assert runner.failures == 1
    assert runner.last_error is None  # a later turn succeeded
