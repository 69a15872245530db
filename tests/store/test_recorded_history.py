"""Reading recorded history (``store/history.py``) on SQLite and PostgreSQL: every run of
a job with how it ended, retries, preemptions with their stop, cancellations while
waiting, runs still open at the window's end, and the window's edges; the successful runs
start guesses learn from, and a guess that learns from the user's own runs first."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.api import explain
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.domain.loading import load_cluster_text
from allotment.store.configs import apply_cluster_config
from allotment.store.history import config_versions, finished_runs, recorded_jobs
from allotment.store.jobs import cancel_job, create_job, requeue_job, transition_job
from allotment.store.models import Attempt

T0 = 1_800_000_000.0
_S = JobState


def spec(name: str, **extra: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "queue": "research",
            "replicas": [{"count": 2, "resources": {"gpu": 1}}],
            "command": ["true"],
            **extra,
        }
    )


def submit(db: Session, job_id: str, at: float, *, user: str = "ada", **extra: Any) -> None:
    create_job(
        db,
        spec(job_id, **extra),
        tenant="vision",
        user=user,
        at=at,
        job_id=job_id,
        accepted="ok",
        priority_class="normal",
    )


def admit(db: Session, job_id: str, at: float, number: int, *, ended: float | None = None) -> None:
    transition_job(db, job_id, _S.ADMITTED, at=at, message="admitted")
    db.add(
        Attempt(
            job_id=job_id,
            number=number,
            state="admitted",
            start_time=at,
            end_time=ended,
            pool="a100",
            allocation=[],
            borrowed={"gpu": 1000},
        )
    )
    job = transition_job(db, job_id, _S.STARTING, at=at, message="launched")
    job.attempt = number
    transition_job(db, job_id, _S.RUNNING, at=at, message="running")


def end(db: Session, job_id: str, to: JobState, at: float, **kw: Any) -> None:
    transition_job(db, job_id, to, at=at, message=to.value, **kw)


def test_runs_retries_preemptions_cancellations_and_open_runs(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as db:
        # ok: one run, succeeded; its processes ended 0.1 s before the loop saw it.
        submit(db, "ok", T0)
        admit(db, "ok", T0 + 5, 1, ended=T0 + 64.9)
        end(db, "ok", _S.SUCCEEDED, T0 + 65)
        # retried: failed, back in line, then succeeded.
        submit(db, "retried", T0 + 1)
        admit(db, "retried", T0 + 2, 1)
        end(db, "retried", _S.FAILED, T0 + 12, failure_class=FailureClass.USER_CODE)
        requeue_job(db, "retried", at=T0 + 12, not_before=None, message="retry")
        admit(db, "retried", T0 + 20, 2)
        end(db, "retried", _S.SUCCEEDED, T0 + 50)
        # bumped: preempted (stopped 2 s later), then still running at the end.
        submit(db, "bumped", T0 + 3)
        admit(db, "bumped", T0 + 4, 1)
        end(db, "bumped", _S.PREEMPTED, T0 + 30)
        requeue_job(db, "bumped", at=T0 + 32, not_before=None, message="requeued")
        admit(db, "bumped", T0 + 40, 2)
        # gave_up: cancelled while it waited.
        submit(db, "gave_up", T0 + 6)
        cancel_job(db, "gave_up", at=T0 + 9, by="ada")
        # old: ended before the window; late: submitted after it.
        submit(db, "old", T0 - 100)
        admit(db, "old", T0 - 90, 1)
        end(db, "old", _S.SUCCEEDED, T0 - 80)
        submit(db, "late", T0 + 500)
    with sessions() as db:
        jobs = {j.id: j for j in recorded_jobs(db, since=T0, until=T0 + 100)}
    assert sorted(jobs) == ["bumped", "gave_up", "ok", "retried"]
    ok = jobs["ok"]
    assert ok.tenant == "vision" and ok.queue == "research" and ok.state == "succeeded"
    assert ok.spec["replicas"][0]["count"] == 2
    (run,) = ok.runs
    assert (run.admitted, run.released, run.ended_as) == (T0 + 5, T0 + 65, "succeeded")
    assert run.exited == T0 + 64.9 and run.pool == "a100" and run.borrowed_gpus == 1000
    assert [(r.admitted, r.released, r.ended_as) for r in jobs["retried"].runs] == [
        (T0 + 2, T0 + 12, "failed"),
        (T0 + 20, T0 + 50, "succeeded"),
    ]
    first, second = jobs["bumped"].runs
    assert (first.released, first.ended_as, first.stopped) == (T0 + 30, "preempted", T0 + 32)
    assert (second.admitted, second.released, second.ended_as) == (T0 + 40, None, None)
    assert jobs["gave_up"].runs == () and jobs["gave_up"].withdrawn == T0 + 9


def test_moves_after_the_window_are_not_known_yet(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as db:
        submit(db, "long", T0)
        admit(db, "long", T0 + 1, 1, ended=T0 + 199)
        end(db, "long", _S.SUCCEEDED, T0 + 200)
    with sessions() as db:
        (job,) = recorded_jobs(db, since=T0, until=T0 + 100)
    (run,) = job.runs
    assert run.released is None and run.ended_as is None and run.exited is None


def test_config_versions_applied_before_the_end(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as db:
        apply_cluster_config(db, "pools: []\n", at=T0)
        apply_cluster_config(db, "pools: [{name: a}]\n", at=T0 + 10)
        apply_cluster_config(db, "pools: [{name: b}]\n", at=T0 + 1000)
    with sessions() as db:
        versions = config_versions(db, until=T0 + 100)
    assert [(v.version, v.applied_at) for v in versions] == [(1, T0), (2, T0 + 10)]


def test_finished_runs_are_the_latest_successes_oldest_first_with_gpus_and_limits(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as db:
        for i, (state, ran, extra) in enumerate(
            [
                ("succeeded", 100.0, {}),
                ("failed", 7.0, {}),  # not a success: not learned from
                ("succeeded", 200.0, {"max_runtime": "1h"}),
                ("succeeded", 300.0, {"max_runtime": 90}),
                ("running", None, {}),  # still running: no run time yet
            ]
        ):
            job_id = f"j{i}"
            submit(db, job_id, T0, user="ada" if i % 2 else "grace", **extra)
            start = T0 + 10 * i
            db.add(
                Attempt(
                    job_id=job_id,
                    number=1,
                    state=state,
                    start_time=start,
                    end_time=None if ran is None else start + ran,
                    pool="a100",
                    allocation=[
                        {"group": "w", "index": r, "node": f"n{r}", "resources": {"gpu": 1000}}
                        for r in range(2)
                    ],
                    borrowed={},
                )
            )
    with sessions() as db:
        runs = finished_runs(db)
        assert [(r.queue, r.gpus, r.seconds, r.limit, r.user) for r in runs] == [
            ("research", 2000, 100.0, None, "grace"),
            ("research", 2000, 200.0, 3600.0, "grace"),
            ("research", 2000, 300.0, 90.0, "ada"),
        ]
        # The latest by end: the two that ended last, still oldest first.
        assert [r.seconds for r in finished_runs(db, limit=2)] == [200.0, 300.0]


ONE_NODE = """
pools: [{name: a100}]
nodes: [{name: n0, pool: a100, capacity: {gpu: 2, cpu: 16, memory: 64Gi}}]
tenants: [{name: vision, members: [{user: ada, role: member}]}]
queues:
  - {name: root, children: [{name: research, tenant: vision, quota: {a100: {gpu: 2}}}]}
"""


def ran(db: Session, job_id: str, user: str, start: float, seconds: float | None) -> None:
    """``user``'s job ``job_id`` on both GPUs of n0 from ``start``: succeeded after
    ``seconds``, or still running (None)."""
    submit(db, job_id, start, user=user)
    transition_job(db, job_id, _S.ADMITTED, at=start, message="admitted")
    transition_job(db, job_id, _S.STARTING, at=start, message="launched").attempt = 1
    transition_job(db, job_id, _S.RUNNING, at=start, message="running")
    db.add(
        Attempt(
            job_id=job_id,
            number=1,
            state="running" if seconds is None else "succeeded",
            start_time=start,
            end_time=None if seconds is None else start + seconds,
            pool="a100",
            allocation=[
                {"group": "w", "index": r, "node": "n0", "resources": {"gpu": 1000}}
                for r in range(2)
            ],
            borrowed={},
        )
    )
    if seconds is not None:
        end(db, job_id, _S.SUCCEEDED, at=start + seconds)


@pytest.mark.parametrize(("holder", "at_least", "at_most"), [("ada", 2.5, 3.0), ("cy", 0.5, 1.0)])
def test_a_guessed_start_learns_from_the_holders_own_runs_first(
    sessions: sessionmaker[Session], holder: str, at_least: float, at_most: float
) -> None:
    """ada's runs here take three hours and bob's a minute: a job waiting behind ada's
    is guessed to start about three hours on; behind cy's (who has run nothing here)
    the queue's mix of both tells."""
    cluster = load_cluster_text(ONE_NODE)
    with sessions.begin() as db:
        for i in range(10):
            ran(db, f"ada{i}", "ada", T0 + 20_000 * i, 3 * 3600.0)
        for i in range(30):
            ran(db, f"bob{i}", "bob", T0 + 200_000 + 100 * i, 60.0)
        now = T0 + 300_000
        ran(db, "holding", holder, now - 30, None)
        submit(db, "waiting", now, user="bob")
    with sessions() as db:
        why = explain.why(db, cluster, "waiting", now=now)
    assert why.state == "pending" and why.estimate_basis == "history"
    assert why.estimated_start is not None
    start = datetime.strptime(why.estimated_start, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    hours = (start.timestamp() - now) / 3600
    assert at_least <= hours <= at_most
