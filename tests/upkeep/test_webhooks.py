"""Webhook deliveries against a real HTTP receiver on 127.0.0.1: the payload and its
signature, retries with back-off after 500s, giving up, leases between two workers, and
a receiver that never answers not slowing the scheduler down."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.runner import LoopRunner
from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.store.alerts import claim_delivery
from allotment.store.models import Alert, Job
from allotment.upkeep.alerts import MaxWaitCheck, fire_max_wait_alerts
from allotment.upkeep.webhooks import SIGNATURE_HEADER, WebhookDeliveries
from tests.control.conftest import CLUSTER, MakeLoop, Submit, wait_until
from tests.control.receiver import receiver

T0 = 1_800_000_000.0
SECRET = "s3cret"


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cluster_for(url: str, *, secret: str | None = SECRET, max_wait: str = "10m") -> Cluster:
    """The local example cluster with tenant ``me`` sending alerts to ``url`` and queue
    ``default`` alerting after ``max_wait``."""
    text = CLUSTER.read_text()
    hook = f'{{url: "{url}"' + (f', secret: "{secret}"}}' if secret else "}")
    text = text.replace("  - name: me\n", f"  - name: me\n    webhook: {hook}\n")
    text = text.replace(
        "      - name: default\n", f"      - name: default\n        max_wait: {max_wait}\n"
    )
    return load_cluster_text(text)


def the_alert(sessions: sessionmaker[Session]) -> Alert:
    with sessions() as db:
        [alert] = db.scalars(select(Alert)).all()
        return alert


def fire(sessions: sessionmaker[Session], cluster: Cluster, submit: Submit) -> str:
    """A job of ``me`` in ``default`` that has waited an hour, alerted now."""
    job_id = submit("pass", gpu=64)
    with sessions.begin() as db:
        row = db.get(Job, job_id)
        assert row is not None
        row.submit_time = T0 - 3600
    assert len(fire_max_wait_alerts(sessions, cluster, now=T0)) == 1
    return job_id


def test_delivered_signed_with_the_tenant_secret(
    sessions: sessionmaker[Session], submit: Submit
) -> None:
    with receiver() as hook:
        cluster = cluster_for(hook.url)
        job_id = fire(sessions, cluster, submit)
        clock = Clock(T0 + 1)
        worker = WebhookDeliveries(sessions, lambda: cluster, clock=clock)
        try:
            assert worker.deliver_due() == 1
        finally:
            worker.stop()
    [call] = hook.calls
    expected = "sha256=" + hmac.new(SECRET.encode(), call.body, hashlib.sha256).hexdigest()
    assert call.headers[SIGNATURE_HEADER] == expected
    assert call.headers["Content-Type"] == "application/json"
    body = call.json
    alert = the_alert(sessions)
    assert call.headers["X-Allotment-Alert"] == str(alert.id) == str(body["id"])
    assert body["kind"] == "max_wait" and body["job"] == job_id
    assert (body["tenant"], body["queue"]) == ("me", "default")
    assert body["at"] == "2027-01-15T08:00:00Z"
    assert body["detail"]["waited_s"] == 3600 and body["detail"]["max_wait_s"] == 600
    assert body["message"] == alert.message
    assert (alert.delivery, alert.tries, alert.delivered_at) == ("delivered", 1, T0 + 1)
    assert alert.next_try_at is None and alert.last_error is None


def test_unsigned_without_a_secret(sessions: sessionmaker[Session], submit: Submit) -> None:
    with receiver() as hook:
        cluster = cluster_for(hook.url, secret=None)
        fire(sessions, cluster, submit)
        worker = WebhookDeliveries(sessions, lambda: cluster, clock=Clock(T0))
        try:
            worker.deliver_due()
        finally:
            worker.stop()
    [call] = hook.calls
    assert SIGNATURE_HEADER not in call.headers


def test_retried_with_back_off_after_two_500s(
    sessions: sessionmaker[Session], submit: Submit
) -> None:
    clock = Clock(T0)
    with receiver([500, 500]) as hook:
        cluster = cluster_for(hook.url)
        fire(sessions, cluster, submit)
        worker = WebhookDeliveries(sessions, lambda: cluster, clock=clock, base_delay_s=10)
        try:
            assert worker.deliver_due() == 1
            alert = the_alert(sessions)
            assert (alert.delivery, alert.tries, alert.last_error) == ("pending", 1, "HTTP 500")
            assert alert.next_try_at == T0 + 10
            clock.now = T0 + 9
            assert worker.deliver_due() == 0  # not due yet
            clock.now = T0 + 10
            assert worker.deliver_due() == 1
            assert the_alert(sessions).next_try_at == T0 + 10 + 20  # doubled
            clock.now = T0 + 30
            assert worker.deliver_due() == 1
            clock.now = T0 + 10_000
            assert worker.deliver_due() == 0  # delivered: never again
        finally:
            worker.stop()
    assert len(hook.calls) == 3
    assert len({call.body for call in hook.calls}) == 1  # the same body each time
    alert = the_alert(sessions)
    assert (alert.delivery, alert.tries, alert.delivered_at) == ("delivered", 3, T0 + 30)


def test_failed_once_tries_are_exhausted(sessions: sessionmaker[Session], submit: Submit) -> None:
    clock = Clock(T0)
    with receiver([500, 503, 502, 200]) as hook:
        cluster = cluster_for(hook.url)
        fire(sessions, cluster, submit)
        worker = WebhookDeliveries(
            sessions, lambda: cluster, clock=clock, base_delay_s=1, max_tries=3
        )
        try:
            for _ in range(5):
                worker.deliver_due()
                clock.now += 100
        finally:
            worker.stop()
    assert len(hook.calls) == 3
    alert = the_alert(sessions)
    assert (alert.delivery, alert.tries, alert.next_try_at) == ("failed", 3, None)
    assert alert.last_error == "HTTP 502"


def test_a_dead_receiver_is_a_connection_error(
    sessions: sessionmaker[Session], submit: Submit
) -> None:
    with receiver() as hook:
        url = hook.url  # closed when the block ends: nobody listens there any more
    cluster = cluster_for(url)
    fire(sessions, cluster, submit)
    worker = WebhookDeliveries(sessions, lambda: cluster, clock=Clock(T0), timeout_s=2)
    try:
        assert worker.deliver_due() == 1
    finally:
        worker.stop()
    alert = the_alert(sessions)
    assert alert.delivery == "pending" and (alert.last_error or "").startswith("ConnectError")


def test_only_one_worker_takes_a_try(sessions: sessionmaker[Session], submit: Submit) -> None:
    cluster = cluster_for("http://127.0.0.1:9/hook")
    fire(sessions, cluster, submit)
    with sessions() as db:
        [first_read] = db.scalars(select(Alert)).all()
    with sessions() as db:
        [second_read] = db.scalars(select(Alert)).all()
    with sessions.begin() as db:
        assert claim_delivery(db, first_read, now=T0, lease_s=30) == T0 + 30
    with sessions.begin() as db:
        assert claim_delivery(db, second_read, now=T0, lease_s=30) is None
    assert the_alert(sessions).tries == 1


def test_a_receiver_that_never_answers_never_delays_a_cycle(
    sessions: sessionmaker[Session], submit: Submit, make_loop: MakeLoop, tmp_path: Path
) -> None:
    with receiver() as hook:
        hook.hang.set()
        cluster = cluster_for(hook.url, max_wait="0s")
        worker = WebhookDeliveries(sessions, lambda: cluster, timeout_s=5, poll_s=0.05)
        check = MaxWaitCheck(
            sessions, lambda: cluster, clock=time.time, every_s=0, on_fired=worker.wake
        )
        runner = LoopRunner(make_loop(), steps=[check])
        worker.start()
        try:
            submit("pass", gpu=64)  # never fits: waits, and is alerted at once
            runner.turn(reconcile=True)
            wait_until(lambda: len(hook.calls) == 1, "the worker calls the hanging receiver")
            durations = []
            for _ in range(5):
                submit("pass", gpu=64)
                started = time.monotonic()
                runner.turn()
                durations.append(time.monotonic() - started)
            assert check.fired == 6
            assert max(durations) < 1.0, durations  # the hanging call takes 5 s
            assert len(hook.calls) == 1  # the worker is still stuck in its first call
        finally:
            worker.stop(timeout=10)
    with sessions() as db:
        rows = db.scalars(select(Alert).order_by(Alert.id)).all()
    assert [a.delivery for a in rows] == ["pending"] * 6
    assert rows[0].tries == 1 and (rows[0].last_error or "").startswith("ReadTimeout")
