"""``max_wait`` alerts on SQLite and PostgreSQL: one alert per wait, whoever checks and
however often; none for a job admitted in time; the wait of a requeued job counted from
the end of its attempt."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from allotment.domain.cluster import Cluster
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.domain.loading import load_cluster_text
from allotment.store.alerts import ALERT, NewAlert, fire_alert, list_alerts
from allotment.store.db import make_engine, session_factory
from allotment.store.jobs import create_job, events_for, requeue_job, transition_job
from allotment.store.models import Alert, Attempt, Base
from allotment.upkeep.alerts import MAX_WAIT, dedupe_key, fire_max_wait_alerts, max_waits

S = JobState
T0 = 1_800_000_000.0

CLUSTER = """
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 2, cpu: 8, memory: 16Gi}}]
tenants:
  - {name: vision, webhook: {url: "http://127.0.0.1:9/hook", secret: s3cret}}
  - {name: nlp}
queues:
  - name: root
    max_wait: 1h
    children:
      - {name: fast, tenant: vision, max_wait: 10m, quota: {local: {gpu: 1}}}
      - {name: slow, tenant: nlp, quota: {local: {gpu: 1}}}
  - {name: free, tenant: nlp}
"""


def cluster() -> Cluster:
    return load_cluster_text(CLUSTER)


def submit(
    sessions: sessionmaker[Session], queue: str, *, at: float, tenant: str = "vision"
) -> str:
    spec = JobSpec.model_validate(
        {
            "name": "secret-project",
            "queue": queue,
            "replicas": [{"count": 1, "resources": {"gpu": 1}}],
            "command": ["true"],
        }
    )
    with sessions.begin() as db:
        job = create_job(db, spec, tenant=tenant, user="bob", at=at, priority_class="training")
        transition_job(db, job.id, S.PENDING, at=at, message="accepted", job=job)
        return job.id


def alerts(sessions: sessionmaker[Session]) -> list[Alert]:
    with sessions() as db:
        return list(db.scalars(select(Alert).order_by(Alert.id)))


def alert_events(sessions: sessionmaker[Session], job_id: str) -> list[str]:
    with sessions() as db:
        return [e.message for e in events_for(db, job_id) if e.kind == ALERT]


def test_limits_are_inherited_from_the_nearest_ancestor() -> None:
    assert max_waits(cluster()) == {"fast": 600.0, "slow": 3600.0}


def test_a_job_waiting_past_max_wait_fires_exactly_once(sessions: sessionmaker[Session]) -> None:
    job = submit(sessions, "fast", at=T0)
    assert fire_max_wait_alerts(sessions, cluster(), now=T0 + 599) == []
    [fired] = fire_max_wait_alerts(sessions, cluster(), now=T0 + 601)
    # Checked again, and by a "restarted" server (a new session factory on the store).
    assert fire_max_wait_alerts(sessions, cluster(), now=T0 + 700) == []
    again = sessionmaker(bind=sessions.kw["bind"], expire_on_commit=False)
    assert fire_max_wait_alerts(again, cluster(), now=T0 + 5000) == []
    [alert] = alerts(sessions)
    assert alert.id == fired
    assert (alert.kind, alert.job_id, alert.tenant, alert.queue) == (
        MAX_WAIT,
        job,
        "vision",
        "fast",
    )
    assert alert.dedupe_key == dedupe_key(job, 0) == f"max_wait:{job}:0"
    assert (alert.delivery, alert.tries, alert.next_try_at) == ("pending", 0, T0 + 601)
    assert alert.webhook == "http://127.0.0.1:9/hook"
    assert alert.detail["waited_s"] == 601 and alert.detail["max_wait_s"] == 600
    assert alert.detail["waiting_since"] == T0
    assert "has waited 10m1s in queue fast, more than its max_wait of 10m" in alert.message
    assert alert_events(sessions, job) == [alert.message]


def test_no_alert_for_a_job_admitted_in_time_or_without_a_limit(
    sessions: sessionmaker[Session],
) -> None:
    admitted = submit(sessions, "fast", at=T0)
    unlimited = submit(sessions, "free", at=T0, tenant="nlp")
    with sessions.begin() as db:
        transition_job(db, admitted, S.ADMITTED, at=T0 + 60, message="admitted")
    assert fire_max_wait_alerts(sessions, cluster(), now=T0 + 86400) == []
    assert alerts(sessions) == []
    assert alert_events(sessions, admitted) == alert_events(sessions, unlimited) == []


def test_a_tenant_without_a_webhook_gets_delivery_none(sessions: sessionmaker[Session]) -> None:
    job = submit(sessions, "slow", at=T0, tenant="nlp")
    assert fire_max_wait_alerts(sessions, cluster(), now=T0 + 3599) == []
    assert len(fire_max_wait_alerts(sessions, cluster(), now=T0 + 3600)) == 1
    [alert] = alerts(sessions)
    assert (alert.job_id, alert.delivery, alert.webhook, alert.next_try_at) == (
        job,
        "none",
        None,
        None,
    )


def test_a_requeued_job_waits_from_the_end_of_its_attempt(sessions: sessionmaker[Session]) -> None:
    job = submit(sessions, "fast", at=T0)
    with sessions.begin() as db:
        db.add(Attempt(job_id=job, number=1, state="admitted", start_time=T0 + 10))
        row = transition_job(db, job, S.ADMITTED, at=T0 + 10, message="admitted")
        row.attempt = 1
        transition_job(db, job, S.STARTING, at=T0 + 10, message="launched")
        transition_job(db, job, S.RUNNING, at=T0 + 11, message="running")
        transition_job(db, job, S.PREEMPTED, at=T0 + 5000, message="preempted")
        attempt = db.get(Attempt, (job, 1))
        assert attempt is not None
        attempt.end_time = T0 + 5000
        requeue_job(db, job, at=T0 + 5001, not_before=None, message="requeued")
    # Submitted long ago, but waiting only since T0 + 5000.
    assert fire_max_wait_alerts(sessions, cluster(), now=T0 + 5599) == []
    assert len(fire_max_wait_alerts(sessions, cluster(), now=T0 + 5600)) == 1
    [alert] = alerts(sessions)
    assert alert.dedupe_key == f"max_wait:{job}:1" and alert.detail["waiting_since"] == T0 + 5000


def test_a_retry_waits_from_its_back_off(sessions: sessionmaker[Session]) -> None:
    job = submit(sessions, "fast", at=T0)
    with sessions.begin() as db:
        db.add(Attempt(job_id=job, number=1, state="failed", start_time=T0, end_time=T0 + 5))
        row = transition_job(db, job, S.ADMITTED, at=T0, message="admitted")
        row.attempt = 1
        transition_job(
            db, job, S.FAILED, at=T0 + 5, message="x", failure_class=FailureClass.USER_CODE
        )
        requeue_job(db, job, at=T0 + 5, not_before=T0 + 3600, message="retry")
    assert fire_max_wait_alerts(sessions, cluster(), now=T0 + 4199) == []
    assert len(fire_max_wait_alerts(sessions, cluster(), now=T0 + 4200)) == 1


def test_a_backlog_fires_a_bounded_number_per_check_oldest_first(
    sessions: sessionmaker[Session],
) -> None:
    jobs = [submit(sessions, "fast", at=T0 + i) for i in range(3)]
    assert len(fire_max_wait_alerts(sessions, cluster(), now=T0 + 3600, most=2)) == 2
    assert [a.job_id for a in alerts(sessions)] == jobs[:2]
    assert len(fire_max_wait_alerts(sessions, cluster(), now=T0 + 3601, most=2)) == 1
    assert [a.job_id for a in alerts(sessions)] == jobs


def test_fire_alert_tolerates_the_same_key(sessions: sessionmaker[Session]) -> None:
    job = submit(sessions, "fast", at=T0)
    new = NewAlert(
        kind="max_wait",
        dedupe_key="max_wait:x:0",
        message="m",
        tenant="vision",
        job_id=job,
        detail={},
    )
    with sessions.begin() as db:
        first = fire_alert(db, new, at=T0)
    with sessions.begin() as db:
        assert fire_alert(db, new, at=T0 + 1) is None
    assert first is not None and [a.id for a in alerts(sessions)] == [first]
    assert len(alert_events(sessions, job)) == 1


def test_listing_is_narrowed_to_a_tenant(sessions: sessionmaker[Session]) -> None:
    mine = submit(sessions, "fast", at=T0)
    theirs = submit(sessions, "slow", at=T0 + 1, tenant="nlp")
    fire_max_wait_alerts(sessions, cluster(), now=T0 + 3601)
    with sessions() as db:
        assert [a.job_id for a in list_alerts(db, tenant="vision")] == [mine]
        assert [a.job_id for a in list_alerts(db)] == [mine, theirs]
        assert [a.job_id for a in list_alerts(db, tenant="nlp", kind="max_wait")] == [theirs]


@settings(max_examples=40, deadline=None)
@given(
    waits=st.lists(
        st.tuples(
            st.sampled_from(["fast", "slow"]),
            st.integers(min_value=0, max_value=7200),
            st.one_of(st.none(), st.integers(min_value=0, max_value=7200)),
        ),
        min_size=1,
        max_size=6,
    ),
    checks=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=6),
)
def test_an_alert_fires_once_exactly_when_some_check_saw_the_wait_overdue(
    tmp_path_factory: pytest.TempPathFactory,
    waits: list[tuple[str, int, int | None]],
    checks: list[int],
) -> None:
    """Jobs submitted at ``T0 + offset`` (admitted at ``T0 + admitted`` when given),
    checked at increasing times: a job has one alert iff some check before its admission
    found it waiting at least its limit, and never more than one."""
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('prop') / 'a.db'}")
    Base.metadata.create_all(engine)
    sessions = session_factory(engine)
    limits = max_waits(cluster())
    jobs: list[tuple[str, float, float | None, float]] = []
    for queue, offset, admitted_after in waits:
        job_id = submit(sessions, queue, at=T0 + offset)
        admitted = None if admitted_after is None else T0 + offset + admitted_after
        jobs.append((job_id, T0 + offset, admitted, limits[queue]))
    admissions = sorted((a, j) for j, _, a, _ in jobs if a is not None)
    for when in sorted(T0 + c for c in checks):
        while admissions and admissions[0][0] <= when:
            with sessions.begin() as db:
                transition_job(db, admissions.pop(0)[1], S.ADMITTED, at=when, message="a")
        fire_max_wait_alerts(sessions, cluster(), now=when)
    fired = {a.job_id for a in alerts(sessions)}
    assert len(alerts(sessions)) == len(fired)  # at most one each
    times = sorted(T0 + c for c in checks)
    for job_id, submitted, admitted, limit in jobs:
        expected = any(t - submitted >= limit and (admitted is None or t < admitted) for t in times)
        assert (job_id in fired) == expected, (job_id, submitted, admitted, limit)
    engine.dispose()
