"""``GET /api/v1/report`` over a real server with real tokens: figures that add up,
tenancy, and clear errors for a bad window or grouping."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from allotment.api.app import create_app
from allotment.api.auth import StoreTokens
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.accounting import rows
from tests.api.conftest import serve
from tests.api.tenancy import CLUSTER, People

PRICED = CLUSTER.replace("pools: [{name: local}]", "pools: [{name: local, price_per_gpu_hour: 3}]")
T0 = 1_800_000_000.0
NOW = T0 + 86400.0


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> Iterator[People]:
    root: Path = tmp_path_factory.mktemp("report")
    engine = make_engine(f"sqlite:///{root / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as db:
        # vision: 2 GPUs for 3h (T0+1h..T0+4h), busy 75% for the first 2h, then unmeasured.
        rows.job(db, "j-v1", tenant="vision", queue="vision-q", user="bob", state="succeeded")
        rows.attempt(db, "j-v1", 1, pool="local", start=T0 + 3600, end=T0 + 4 * 3600, gpus=2)
        rows.usage(db, "j-v1", 1, start=T0 + 3600, length=7200, util=75)
        rows.event(db, "j-v1", T0 + 3000, "pending")
        rows.event(db, "j-v1", T0 + 3600, "admitted")
        # vision: 1 GPU from T0+23h, still running.
        rows.job(db, "j-v2", tenant="vision", queue="vision-q", user="dave", type="notebook")
        rows.attempt(db, "j-v2", 1, pool="local", start=T0 + 23 * 3600, end=None, gpus=1)
        # nlp: 1 GPU for 30m, failed with oom.
        rows.job(db, "j-n1", tenant="nlp", queue="nlp-q", user="nick", state="failed")
        rows.attempt(
            db,
            "j-n1",
            1,
            pool="local",
            start=T0 + 7200,
            end=T0 + 9000,
            gpus=1,
            state="failed",
            failure_class="oom",
        )
    app = create_app(
        cluster=load_cluster_text(PRICED),
        store_sessions=sessions,
        clock=lambda: NOW,
        authenticator=StoreTokens(sessions, clock=time.time),
    )
    with serve(app) as url:
        people = People.issued(url, sessions)
        try:
            yield people
        finally:
            people.close()
    engine.dispose()


def exact(value: Any) -> Decimal:
    return Decimal(repr(value))


def test_platform_admin_sees_every_tenant_and_the_figures_add_up(people: People) -> None:
    report = people["root"].report(since="1d", by="tenant", jobs=True)
    assert (report["since"], report["until"], report["tenant"]) == (T0, NOW, None)
    by_key = {r["key"]: r for r in report["rows"]}
    assert set(by_key) == {"vision", "nlp"}
    vision = by_key["vision"]
    assert vision["allocated_gpu_hours"] == 7  # 2 GPUs x 3h + 1 GPU x 1h
    assert (vision["used_gpu_hours"], vision["idle_gpu_hours"]) == (3, 1)
    assert vision["unmeasured_gpu_hours"] == 3 and vision["cost"] == 21
    assert (vision["utilization"], vision["measured_fraction"]) == (0.75, 4 / 7)
    assert by_key["nlp"]["cost"] == 1.5
    assert vision["interrupted_gpu_hours"] == 0  # nothing of it was preempted or reclaimed
    for figure in (
        "allocated_gpu_hours",
        "used_gpu_hours",
        "idle_gpu_hours",
        "interrupted_gpu_hours",
        "cost",
    ):
        of_records = sum(exact(r[figure]) for r in report["records"])
        of_rows = sum(exact(r[figure]) for r in report["rows"])
        assert of_records == of_rows == exact(report["total"][figure])
    assert report["failures"] == [
        {"failure_class": "oom", "pool": "local", "queue": "nlp-q", "type": "training", "count": 1}
    ]
    assert report["waits_total"]["count"] == 1 and report["waits_total"]["max_s"] == 600


@pytest.mark.parametrize("user", ["alice", "bob", "carol"])
def test_a_tenant_sees_only_its_own_jobs(people: People, user: str) -> None:
    report = people[user].report(since="1d", by="user", jobs=True)
    assert report["tenant"] == "vision"
    assert {r["tenant"] for r in report["records"]} == {"vision"}
    assert [r["key"] for r in report["rows"]] == ["bob", "dave"]
    assert [r["key"] for r in report["cost_by_tenant"]] == ["vision"]
    assert report["failures"] == [] and report["total"]["cost"] == 21


def test_nlp_sees_only_nlp(people: People) -> None:
    report = people["nora"].report(since="1d", by="queue")
    assert [r["key"] for r in report["rows"]] == ["nlp-q"]
    assert report["records"] is None
    assert report["total"]["allocated_gpu_hours"] == 0.5


def test_an_absolute_window(people: People) -> None:
    report = people["root"].report(since="2027-01-15T08:00:00Z", until=str(NOW), by="pool")
    assert (report["since"], report["until"]) == (T0, NOW)
    assert report["total"]["allocated_gpu_hours"] == 7.5
    ahead = people["root"].report(since="2d", until=str(NOW + 86400), by="tenant", jobs=True)
    [open_one] = [r for r in ahead["records"] if r["open"]]
    assert open_one["job"] == "j-v2" and open_one["held_until"] == NOW  # not the future
    narrow = people["root"].report(since="1h", until=str(T0 + 2 * 3600), by="pool")
    assert narrow["total"]["allocated_gpu_hours"] == 2  # j-v1, T0+1h..T0+2h


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("since=yesterday", "since"),
        ("since=-3d", "since"),
        ("since=1d&until=soon", "until"),
        ("since=2030-01-01&until=2029-01-01", "since"),
        ("since=400d", "366 days"),
        ("by=colour", "by"),
        ("jobs=maybe", "jobs"),
    ],
)
def test_bad_parameters_are_422_naming_them(people: People, query: str, named: str) -> None:
    response = httpx.get(
        f"{people.url}/api/v1/report?{query}",
        headers={"Authorization": f"Bearer {people.tokens['root']}"},
        timeout=10,
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] in ("invalid_input", "invalid_request")
    assert named in body["message"]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("since=0.000001", "at least 1 second"),
        ("since=2027-01-15T08:00:00Z&until=2027-01-15T08:00:00.000001Z", "at least 1 second"),
        ("since=1d&until=100000000000000000000", "9999-12-31"),
        (f"since=1d&until={'9' * 60}", "9999-12-31"),
        ("since=1d&until=253402300800", "9999-12-31"),
    ],
)
def test_fault_report_window_out_of_bounds_is_a_422_saying_the_limits(
    people: People, query: str, named: str
) -> None:
    response = httpx.get(
        f"{people.url}/api/v1/report?{query}",
        headers={"Authorization": f"Bearer {people.tokens['root']}"},
        timeout=10,
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "invalid_input"
    assert named in body["message"]


def test_fault_report_window_of_a_second_far_from_the_epoch_has_a_timeline(
    people: People,
) -> None:
    report = people["root"].report(since="1", until="253402300799", by="pool")
    assert len(report["timeline"]) == 96
    assert all(p["allocated_gpus"] == 0 for p in report["timeline"])
