"""``/api/v1/whatif`` and ``/api/v1/history/export`` over a real server with real tokens:
the comparison, tenancy, and clear 4xx answers for a bad proposal, window or policy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from allotment.api.app import create_app
from allotment.api.auth import StoreTokens
from allotment.client import ClientError
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.jobs import create_job, transition_job
from allotment.store.models import Attempt
from tests.api.conftest import serve
from tests.api.tenancy import CLUSTER, People

T0 = 1_800_000_000.0
NOW = T0 + 3600.0


def ran(
    db: Session,
    job_id: str,
    queue: str,
    tenant: str,
    submit: float,
    start: float,
    end: float,
    user: str = "bob",
) -> None:
    spec = JobSpec.model_validate(
        {
            "name": f"secret-{job_id}",
            "queue": queue,
            "replicas": [{"count": 1, "resources": {"gpu": 2}}],
            "command": ["secret-command"],
        }
    )
    create_job(
        db,
        spec,
        tenant=tenant,
        user=user,
        at=submit,
        job_id=job_id,
        accepted="ok",
        priority_class="normal",
    )
    for to, at in ((JobState.ADMITTED, start), (JobState.STARTING, start)):
        transition_job(db, job_id, to, at=at, message=to.value)
    db.add(Attempt(job_id=job_id, number=1, state="running", start_time=start, allocation=[]))
    transition_job(db, job_id, JobState.RUNNING, at=start, message="running")
    transition_job(db, job_id, JobState.SUCCEEDED, at=end, message="done")


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> Iterator[People]:
    root: Path = tmp_path_factory.mktemp("whatif")
    engine = make_engine(f"sqlite:///{root / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as db:
        # Both queues' jobs share the 4-GPU node: each runs 600 s; the later ones wait.
        for i in range(4):
            start, end = T0 + 600 * (i // 2), T0 + 600 * (i // 2 + 1)
            ran(db, f"v{i}", "vision-q", "vision", T0 + i, start, end)
            nlp_user = "nick" if i % 2 else "nora"
            ran(db, f"n{i}", "nlp-q", "nlp", T0 + i, start, end, user=nlp_user)
    app = create_app(
        cluster=load_cluster_text(CLUSTER),
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


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows}


def test_the_platform_admin_sees_every_queue_and_the_fleet(people: People) -> None:
    data = people["root"].whatif(since="1h")
    queues = by_name(data["queues"])
    assert sorted(queues) == ["nlp-q", "vision-q"]
    for row in queues.values():
        assert row["recorded"]["jobs"] == 4
        assert row["recorded"]["wait_avg_s"] == pytest.approx((0 + 0 + 599 + 599) / 4, abs=1)
        assert row["wait_error"] is not None and row["proposed"] is None
    assert data["total"]["recorded"]["jobs"] == 8 and data["versions"] == []
    assert data["fidelity"]["target"] == 0.15 and data["limits"]


def test_a_proposal_with_room_for_every_job_removes_the_waits(people: People) -> None:
    bigger = CLUSTER.replace("capacity: {gpu: 4,", "capacity: {gpu: 16,")
    data = people["root"].whatif(bigger, since="1h", series=True)
    for row in data["queues"]:
        assert row["proposed"]["wait_avg_s"] == 0 < row["current"]["wait_avg_s"]
    assert data["worse"] == []
    assert set(data["series"]) == {"recorded", "current", "proposed"}
    assert len(data["series"]["current"]["utilization"]) == 200


def test_a_tenant_admin_sees_its_own_queues_only(people: People) -> None:
    data = people["alice"].whatif(CLUSTER, since="1h")
    assert [row["name"] for row in data["queues"]] == ["vision-q"]
    assert [row["name"] for row in data["tenants"]] == ["vision"]
    assert data["total"] is None and data["jobs"] == 4
    assert data["fidelity"]["wait_error"] is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"text": "pools: [\n"}, "proposed.yaml"),
        ({"text": CLUSTER.replace("nlp-q", "nlp-renamed")}, "'nlp-q' (4 jobs)"),
        ({"since": "yesterday"}, "since"),
        ({"policy": "fastest"}, "fastest"),
    ],
)
def test_bad_input_is_a_4xx_naming_what_to_change(
    people: People, kwargs: dict[str, Any], words: str
) -> None:
    args: dict[str, Any] = {"since": "1h", **kwargs}
    text = args.pop("text", CLUSTER)
    with pytest.raises(ClientError) as caught:
        people["root"].whatif(text, **args)
    assert 400 <= caught.value.status < 500 and words in str(caught.value)


def test_members_and_viewers_may_not(people: People) -> None:
    for user in ("bob", "carol"):
        with pytest.raises(ClientError) as caught:
            people[user].whatif(since="1h")
        assert caught.value.status == 403


def test_history_export_is_a_trace_without_names_scoped_to_the_tenant(people: People) -> None:
    text, left_out = people["root"].history_export(since="1h")
    lines = text.splitlines()
    assert lines[0].startswith("job_id,submit_time,duration,queue,gpus")
    assert len(lines) == 9 and left_out == 0
    assert "secret" not in text and "v0" not in text
    assert lines[1].split(",")[:5] == ["h1", "0", "600", "nlp-q", "2"]
    mine, _ = people["nina"].history_export(since="1h")
    assert {line.split(",")[3] for line in mine.splitlines()[1:]} == {"nlp-q"}
    response = httpx.get(
        f"{people.url}/api/v1/history/export",
        params={"since": "1h"},
        headers={"Authorization": f"Bearer {people.tokens['root']}"},
    )
    assert response.headers["content-type"].startswith("text/csv")


def test_history_export_may_tell_whose_jobs_are_one_persons_never_who(people: People) -> None:
    text, _ = people["root"].history_export(since="1h", users=True)
    header, *rows = [line.split(",") for line in text.splitlines()]
    assert header[-1] == "user" and len(rows) == 8
    users = {row[0]: row[-1] for row in rows}
    # In submission order: n0 (nora), v0 (bob), n1 (nick), v1 (bob), n2 (nora), ...
    assert [users[f"h{i}"] for i in range(1, 9)] == ["u1", "u2", "u3", "u2"] * 2
    assert not {"bob", "nick", "nora"} & {cell for row in rows for cell in row}
    # A tenant admin's export numbers its own users from u1.
    mine, _ = people["nina"].history_export(since="1h", users=True)
    assert [line.split(",")[-1] for line in mine.splitlines()[1:]] == ["u1", "u2"] * 2


def test_a_tenant_admin_sees_no_fleet_counts(people: People) -> None:
    data = people["nina"].whatif(since="1h")
    assert [row["name"] for row in data["queues"]] == ["nlp-q"]
    assert data["replayed_jobs"] is None and data["assumed"]["estimated_runs"] is None
    assert data["assumed"]["turn_s"] == 0.0
