"""``GET /api/v1/alerts`` as real users with real tokens: each tenant sees its own
alerts only, another tenant's job is not found, the webhook's URL is never shown."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allotment.api.app import create_app
from allotment.api.auth import StoreTokens
from allotment.client import ClientError
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.alerts import NewAlert, fire_alert
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import serve
from tests.api.tenancy import CLUSTER, QUEUE, People, job

HOOK = "https://hooks.example/T0/secret-path"


@pytest.fixture
def people(tmp_path: Path) -> Iterator[tuple[People, dict[str, str]]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    app = create_app(
        cluster=load_cluster_text(CLUSTER),
        store_sessions=sessions,
        authenticator=StoreTokens(sessions, clock=time.time),
    )
    with serve(app) as url:
        people = People.issued(url, sessions)
        jobs = {
            "vision": people["bob"].submit(job(QUEUE["vision"]))["id"],
            "nlp": people["nick"].submit(job(QUEUE["nlp"]))["id"],
        }
        with sessions.begin() as db:
            for tenant, job_id in jobs.items():
                new = NewAlert(
                    kind="max_wait",
                    dedupe_key=f"max_wait:{job_id}:0",
                    message=f"{job_id} waits",
                    tenant=tenant,
                    queue=QUEUE[tenant],
                    job_id=job_id,
                    detail={"waited_s": 5},
                    webhook=HOOK,
                )
                fire_alert(db, new, at=time.time())
        try:
            yield people, jobs
        finally:
            people.close()
    engine.dispose()


def test_each_tenant_sees_its_own_alerts(people: tuple[People, dict[str, str]]) -> None:
    who, jobs = people
    [mine] = who["carol"].alerts()["alerts"]
    assert (mine["job"], mine["tenant"], mine["kind"]) == (jobs["vision"], "vision", "max_wait")
    assert (mine["delivery"], mine["tries"], mine["detail"]) == ("pending", 0, {"waited_s": 5})
    assert "webhook" not in mine and HOOK not in str(mine)
    assert [a["job"] for a in who["nora"].alerts()["alerts"]] == [jobs["nlp"]]
    assert [a["job"] for a in who["root"].alerts()["alerts"]] == [jobs["vision"], jobs["nlp"]]
    assert who["alice"].alerts(kind="idle_warning")["alerts"] == []
    assert [a["job"] for a in who["bob"].alerts(job=jobs["vision"])["alerts"]] == [jobs["vision"]]
    page = who["root"].alerts(limit=1)
    assert len(page["alerts"]) == 1 and page["next_after"] == page["alerts"][0]["id"]
    rest = who["root"].alerts(after=page["next_after"])
    assert [a["job"] for a in rest["alerts"]] == [jobs["nlp"]] and rest["next_after"] is None


def test_another_tenants_job_is_not_found(people: tuple[People, dict[str, str]]) -> None:
    who, jobs = people
    with pytest.raises(ClientError) as refused:
        who["nina"].alerts(job=jobs["vision"])
    assert (refused.value.status, refused.value.code) == (404, "not_found")
