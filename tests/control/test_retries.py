"""Retries with back-off, per failure class: real store, real local executor, real
processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.retries import plan_retry, retry_policy
from allotment.domain.cluster import Cluster, RetryPolicy
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.store.jobs import events_for, get_job
from allotment.store.models import Job
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
)

S = JobState
F = FailureClass
FAIL_FIRST = "import os, sys; sys.exit(1 if os.environ['ALLOTMENT_ATTEMPT'] == '1' else 0)"


def job_row(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions() as db:
        return get_job(db, job_id)


def ended(sessions: sessionmaker[Session], job_id: str, count: int) -> bool:
    """The job is failed or succeeded after ``count`` closed attempts."""
    rows = attempts(sessions, job_id)
    return (
        len(rows) == count
        and all(a.end_time is not None for a in rows)
        and state_of(sessions, job_id) in {S.FAILED, S.SUCCEEDED}
    )


def test_the_policy_is_the_jobs_else_its_queues_else_none(cluster: Cluster) -> None:
    def spec(queue: str, **extra: object) -> JobSpec:
        return JobSpec.model_validate({"name": "t", "queue": queue, "replicas": [{}], **extra})

    own = RetryPolicy(max_attempts=5, on=[F.OOM])
    assert retry_policy(spec("batch", retry={"max_attempts": 5, "on": ["oom"]}), cluster) == own
    batch = retry_policy(spec("batch"), cluster)
    assert batch is not None and (batch.max_attempts, batch.backoff) == (2, 5.0)
    assert retry_policy(spec("default"), cluster) is None


def test_a_retry_is_planned_only_for_a_listed_class_within_max_attempts() -> None:
    policy = RetryPolicy(max_attempts=3, on=[F.USER_CODE], backoff=10, backoff_factor=2)
    first = plan_retry(policy, F.USER_CODE, 1)
    assert first is not None and (first.number, first.of, first.delay) == (1, 2, 10.0)
    assert first.message == "retry 1 of 2 in 10s after user_code"
    second = plan_retry(policy, F.USER_CODE, 2)
    assert second is not None and second.delay == 20.0
    assert plan_retry(policy, F.USER_CODE, 3) is None
    assert plan_retry(policy, F.OOM, 1) is None
    assert plan_retry(None, F.USER_CODE, 1) is None


def test_a_failing_job_runs_twice_then_stays_failed_with_user_code(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    retry = {"max_attempts": 2, "on": ["user_code"], "backoff": "1s"}
    job_id = submit("import sys; sys.exit(1)", fields={"retry": retry})
    loop_until(loop, lambda: ended(sessions, job_id, 2), "two attempts, then an ending")

    job = job_row(sessions, job_id)
    assert (job.state, job.failure_class, job.attempt) == ("failed", "user_code", 2)
    first, second = attempts(sessions, job_id)
    for attempt in (first, second):
        assert (attempt.state, attempt.failure_class, attempt.exit_code) == (
            "failed",
            "user_code",
            1,
        )
    run = ["admitted", "starting", "running", "failed"]
    assert transitions(sessions, job_id) == ["submitted", "pending", *run, "pending", *run]
    with sessions() as db:
        events = events_for(db, job_id)
    [requeue] = [e for e in events if e.from_state == "failed" and e.to_state == "pending"]
    assert requeue.message == "retry 1 of 1 in 1s after user_code"
    assert requeue.detail["delay_s"] == 1.0 and requeue.detail["attempt"] == 1
    readmitted = [e for e in events if e.to_state == "admitted"][1]
    assert readmitted.at >= requeue.at + 1.0  # the back-off was waited out
    assert any(e.kind == "reason" and e.detail["code"] == "backoff" for e in events)
    assert loop.session.running == {}


def test_the_job_waits_with_reason_backoff_then_runs_again(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    retry = {"max_attempts": 3, "on": ["user_code"], "backoff": "2s"}
    job_id = submit(FAIL_FIRST, fields={"retry": retry})
    loop.cycle()

    def waiting() -> bool:
        job = job_row(sessions, job_id)
        return job.state == "pending" and job.attempt == 1 and job.reason_code == "backoff"

    loop_until(loop, waiting, "pending with reason backoff")
    job = job_row(sessions, job_id)
    assert job.not_before is not None and job.not_before > time.time()
    assert job.reason_detail == {"not_before": job.not_before}
    assert job.not_before - time.time() <= 2.0
    assert run_until(loop, sessions, job_id, {S.SUCCEEDED, S.FAILED}) is S.SUCCEEDED
    first, second = attempts(sessions, job_id)
    assert first.failure_class == "user_code" and second.exit_code == 0
    assert second.start_time is not None and second.start_time >= job.not_before


def test_a_failure_class_not_in_on_is_not_retried(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import sys; sys.exit(3)", fields={"retry": {"max_attempts": 3}})
    loop_until(loop, lambda: ended(sessions, job_id, 1), "one attempt, then an ending")
    job = job_row(sessions, job_id)
    assert (job.state, job.failure_class, job.attempt) == ("failed", "user_code", 1)


def test_max_runtime_ends_each_attempt_as_timeout_and_is_retried_per_policy(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    fields = {
        "command": ["sleep", "30"],
        "max_runtime": "1s",
        "retry": {"max_attempts": 2, "on": ["timeout"], "backoff": 0},
    }
    job_id = submit("", fields=fields)
    loop_until(loop, lambda: ended(sessions, job_id, 2), "two timed-out attempts", timeout=15)
    job = job_row(sessions, job_id)
    assert (job.state, job.failure_class) == ("failed", "timeout")
    for attempt in attempts(sessions, job_id):
        assert (attempt.failure_class, attempt.signal) == ("timeout", signal.SIGTERM)
        assert attempt.start_time is not None and attempt.end_time is not None
        assert 0.9 <= attempt.end_time - attempt.start_time < 10


@pytest.mark.parametrize(
    ("queue", "retried"), [("batch", True), ("default", False)], ids=["retried", "not-retried"]
)
def test_a_zombie_is_retried_when_its_policy_retries_node_failure(
    make_loop: MakeLoop,
    sessions: sessionmaker[Session],
    submit: Submit,
    queue: str,
    retried: bool,
) -> None:
    loop = make_loop()  # queue batch retries node_failure with a 5s back-off; default not
    job_id = submit("import time; time.sleep(30)", queue=queue)
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING}) is S.RUNNING
    directory = executor_of(loop).replica_dir(key_of(job_id))
    state = json.loads((directory / "state.json").read_text())
    for pgid in (state["supervisor_pid"], state["pgid"]):
        os.killpg(pgid, signal.SIGKILL)
    shutil.rmtree(directory)

    before = time.time()
    assert loop.reconcile() == []
    job = job_row(sessions, job_id)
    [attempt] = attempts(sessions, job_id)
    assert attempt.failure_class == "node_failure" and attempt.end_time is not None
    assert job_id not in loop.session.running
    if not retried:
        assert (job.state, job.failure_class) == ("failed", "node_failure")
        return
    assert (job.state, job.failure_class) == ("pending", None)
    assert job.not_before is not None and before + 5 <= job.not_before <= time.time() + 5
    assert transitions(sessions, job_id)[-2:] == ["failed", "pending"]
    loop.cycle()
    assert job_row(sessions, job_id).reason_code == "backoff"
    assert state_of(sessions, job_id) is S.PENDING
