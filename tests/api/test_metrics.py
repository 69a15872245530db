"""``GET /metrics`` on SQLite and PostgreSQL, through a real server, parsed with
Prometheus's own parser: the numbers match what the store holds, the event counters
are read incrementally (never counted twice), and no job id or name leaks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.app import create_app
from allotment.api.serving import serve_in_thread
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.alerts import NewAlert, fire_alert
from allotment.store.db import session_factory
from allotment.store.jobs import create_job, requeue_job, transition_job
from allotment.store.models import Attempt, DeviceUsage
from tests.api.tenancy import CLUSTER
from tests.store.conftest import engine  # noqa: F401  (the parametrized fixture)

S = JobState
T0 = 1_800_000_000.0
NAME = "project-nightingale"


class Clock:
    def __init__(self) -> None:
        self.now = T0 + 10_000

    def __call__(self) -> float:
        return self.now


@dataclass
class Scraper:
    url: str
    sessions: sessionmaker[Session]
    clock: Clock

    def text(self) -> str:
        response = httpx.get(self.url + "/metrics", timeout=10)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain")
        return response.text

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(self.text()):
            for sample in family.samples:
                found[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return found


def at(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def scraper(engine: Engine) -> Iterator[Scraper]:  # noqa: F811
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    clock = Clock()
    app = create_app(
        cluster=load_cluster_text(CLUSTER),
        store_sessions=sessions,
        clock=clock,
        metrics_settle_s=0,
    )
    with serve_in_thread(app) as url:
        yield Scraper(url=url, sessions=sessions, clock=clock)


def job(db: Session, queue: str, tenant: str, *, at: float) -> str:
    spec = JobSpec.model_validate(
        {
            "name": NAME,
            "queue": queue,
            "replicas": [{"count": 1, "resources": {"gpu": 1}}],
            "command": ["true"],
        }
    )
    row = create_job(db, spec, tenant=tenant, user="bob", at=at, priority_class="training")
    transition_job(db, row.id, S.PENDING, at=at, message="accepted", job=row)
    return row.id


def admit(db: Session, job_id: str, *, at: float, number: int, device: int = 0) -> None:
    allocation = [
        {
            "group": "worker",
            "index": 0,
            "node": "box",
            "resources": {"gpu": 1000},
            "devices": [device],
        }
    ]
    db.add(Attempt(job_id=job_id, number=number, state="running", start_time=at, pool="local",
                   allocation=allocation, borrowed={}))  # fmt: skip
    row = transition_job(db, job_id, S.ADMITTED, at=at, message="admitted")
    row.attempt = number
    transition_job(db, job_id, S.STARTING, at=at, message="launched")
    transition_job(db, job_id, S.RUNNING, at=at, message="running")


def end(db: Session, job_id: str, number: int, *, at: float) -> None:
    attempt = db.get(Attempt, (job_id, number))
    assert attempt is not None
    attempt.end_time = at


def populate(sessions: sessionmaker[Session]) -> dict[str, str]:
    with sessions.begin() as db:
        a = job(db, "vision-q", "vision", at=T0)
        admit(db, a, at=T0 + 120, number=1)  # waited 2 minutes
        transition_job(db, a, S.PREEMPTED, at=T0 + 500, message="preempted")
        end(db, a, 1, at=T0 + 500)
        requeue_job(db, a, at=T0 + 600, not_before=None, message="requeued")
        admit(db, a, at=T0 + 4200, number=2)  # waited an hour since its requeue
        b = job(db, "nlp-q", "nlp", at=T0)
        admit(db, b, at=T0 + 10, number=1, device=1)
        transition_job(db, b, S.RECLAIMED, at=T0 + 900, message="idle", detail={"reason": "idle"})
        end(db, b, 1, at=T0 + 900)
        c = job(db, "nlp-q", "nlp", at=T0 + 1)
        admit(db, c, at=T0 + 11, number=1, device=1)
        transition_job(db, c, S.FAILED, at=T0 + 50, message="x", failure_class=FailureClass.OOM)
        end(db, c, 1, at=T0 + 50)
        d = job(db, "vision-q", "vision", at=T0 + 2)
        db.add_all(
            [
                DeviceUsage(node="box", device=0, interval_start=T0 + 9000, interval_s=60,
                            samples=6, util_avg=10.0, util_max=20.0, memory_max=1000),
                DeviceUsage(node="box", device=0, interval_start=T0 + 9900, interval_s=60,
                            samples=6, util_avg=75.0, util_max=90.0, memory_max=2**30),
                DeviceUsage(node="box", device=1, interval_start=T0 + 5000, interval_s=60,
                            samples=6, util_avg=50.0, util_max=50.0, memory_max=5),
            ]
        )  # fmt: skip
        for tenant, kind, job_id, hook in (
            ("vision", "max_wait", d, "http://127.0.0.1:9/h"),
            ("nlp", "idle_warning", None, None),
        ):
            new = NewAlert(kind=kind, dedupe_key=f"{kind}:{tenant}", message="m",
                           tenant=tenant, job_id=job_id, detail={}, webhook=hook)  # fmt: skip
            fire_alert(db, new, at=T0 + 9000)
    return {"a": a, "b": b, "c": c, "d": d}


def test_metrics_read_from_the_store(scraper: Scraper) -> None:
    ids = populate(scraper.sessions)
    text = scraper.text()
    for job_id in ids.values():
        assert job_id not in text
    assert NAME not in text
    got = scraper.samples()
    assert at(got, "allot_jobs", state="running", tenant="vision", queue="vision-q") == 1
    assert at(got, "allot_jobs", state="pending", tenant="vision", queue="vision-q") == 1
    assert at(got, "allot_jobs", state="reclaimed", tenant="nlp", queue="nlp-q") == 1
    assert at(got, "allot_jobs", state="failed", tenant="nlp", queue="nlp-q") == 1
    quota = "allot_queue_quota_gpus"
    assert at(got, quota, queue="vision-q", tenant="vision", pool="local", kind="nominal") == 2
    assert at(got, quota, queue="vision-q", tenant="vision", pool="local", kind="used") == 1
    assert at(got, quota, queue="vision-q", tenant="vision", pool="local", kind="borrowed") == 0
    assert at(got, quota, queue="root", tenant="", pool="local", kind="used") == 1
    assert at(got, quota, queue="nlp-q", tenant="nlp", pool="local", kind="used") == 0
    assert at(got, "allot_gpu_utilization", node="box", device="0") == 0.75
    assert at(got, "allot_gpu_memory_bytes", node="box", device="0") == 2**30
    assert at(got, "allot_gpu_utilization", node="box", device="1") is None  # stale
    assert at(got, "allot_alerts_total", kind="max_wait", tenant="vision") == 1
    assert at(got, "allot_alerts_total", kind="idle_warning", tenant="nlp") == 1
    assert at(got, "allot_alert_deliveries", tenant="vision", state="pending") == 1
    assert at(got, "allot_alert_deliveries", tenant="nlp", state="none") == 1
    assert at(got, "allot_preemptions_total", queue="vision-q") == 1
    assert at(got, "allot_reclaims_total", reason="idle") == 1
    wait = "allot_job_wait_seconds"
    assert at(got, wait + "_count", queue="vision-q") == 2
    assert at(got, wait + "_sum", queue="vision-q") == 120 + 3600
    assert at(got, wait + "_bucket", queue="vision-q", le="60.0") == 0
    assert at(got, wait + "_bucket", queue="vision-q", le="120.0") == 1
    assert at(got, wait + "_bucket", queue="vision-q", le="3600.0") == 2
    assert at(got, wait + "_bucket", queue="vision-q", le="+Inf") == 2
    assert at(got, wait + "_count", queue="nlp-q") == 2
    assert at(got, wait + "_sum", queue="nlp-q") == 10 + 10
    assert ("allot_scheduler_cycle_seconds_count", frozenset()) in got


def test_event_counters_are_read_once_and_after_they_settle(engine: Engine) -> None:  # noqa: F811
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    clock = Clock()
    app = create_app(
        cluster=load_cluster_text(CLUSTER), store_sessions=sessions, clock=clock, metrics_settle_s=5
    )
    with serve_in_thread(app) as url:
        scraper = Scraper(url=url, sessions=sessions, clock=clock)
        with sessions.begin() as db:
            b = job(db, "nlp-q", "nlp", at=T0)
            admit(db, b, at=T0 + 10, number=1)
            transition_job(db, b, S.RECLAIMED, at=clock.now - 1, message="zombie")
        first = scraper.samples()
        assert at(first, "allot_job_wait_seconds_count", queue="nlp-q") == 1
        assert at(first, "allot_reclaims_total", reason="unknown") is None  # not settled
        clock.now += 10
        for _ in range(2):  # scraped twice: counted once
            got = scraper.samples()
            assert at(got, "allot_reclaims_total", reason="unknown") == 1
            assert at(got, "allot_job_wait_seconds_count", queue="nlp-q") == 1
