"""Idempotent submissions: a client whose ``POST /jobs`` got no answer sends it again
with the same ``Idempotency-Key`` and gets the job the first request made, never a
second one; the key is the user's own, binds one request, and is checked on both
stores."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine

from allotment.api.app import create_app
from allotment.client import AllotmentClient, ClientError
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import session_factory
from allotment.store.idempotency import find, prune, record
from tests.api.conftest import FakeClock, serve
from tests.store.conftest import engine  # noqa: F401  (the parametrized fixture)

CLUSTER = """
pools: [{name: p}]
nodes: [{name: n, pool: p, capacity: {gpu: 4, cpu: 8, memory: 16Gi}}]
queues: [{name: q, quota: {p: {gpu: 4}}}]
"""
SPEC = 'name: t\nqueue: q\ncommand: ["true"]\nreplicas: [{count: 1, resources: {gpu: 1}}]\n'


@pytest.fixture
def url(engine: Engine) -> Iterator[str]:  # noqa: F811
    migrate.upgrade(engine)
    app = create_app(
        cluster=load_cluster_text(CLUSTER, source="cluster"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
    )
    with serve(app) as base:
        yield base


def post(url: str, path: str, body: object, key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return httpx.post(f"{url}/api/v1{path}", json=body, headers=headers, timeout=10)


def test_fault_a_repeated_submission_with_its_key_makes_one_job(url: str) -> None:
    first = post(url, "/jobs", {"spec": SPEC}, "k-1")
    again = post(url, "/jobs", {"spec": SPEC}, "k-1")
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    other = post(url, "/jobs", {"spec": SPEC}, "k-2")
    assert other.json()["id"] != first.json()["id"]
    without = [post(url, "/jobs", {"spec": SPEC}, None) for _ in range(2)]
    assert without[0].json()["id"] != without[1].json()["id"]
    with AllotmentClient(url) as client:
        assert len(client.list_jobs()["jobs"]) == 4


def test_fault_a_key_sent_with_another_request_is_a_409(url: str) -> None:
    assert post(url, "/jobs", {"spec": SPEC}, "k").status_code == 201
    changed = post(url, "/jobs", {"spec": SPEC.replace("name: t", "name: u")}, "k")
    assert changed.status_code == 409 and changed.json()["code"] == "idempotency_key_reused"
    batch = post(url, "/jobs:batch", {"specs": [SPEC]}, "k")
    assert batch.status_code == 409


def test_fault_a_repeated_batch_with_its_key_makes_its_jobs_once(url: str) -> None:
    body = {"specs": [SPEC, SPEC.replace("name: t", "name: u")]}
    first = post(url, "/jobs:batch", body, "b-1")
    again = post(url, "/jobs:batch", body, "b-1")
    assert first.status_code == again.status_code == 201
    ids = [j["id"] for j in first.json()["jobs"]]
    assert [j["id"] for j in again.json()["jobs"]] == ids and len(ids) == 2


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "é"])
def test_fault_a_malformed_key_is_a_422(url: str, key: str) -> None:
    response = httpx.post(
        f"{url}/api/v1/jobs",
        json={"spec": SPEC},
        headers={"Idempotency-Key": key.encode()},
        timeout=10,
    )
    assert response.status_code == 422


def test_fault_concurrent_requests_with_one_key_make_one_job(url: str) -> None:
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(post(url, "/jobs", {"spec": SPEC}, "race"))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["id"] for a in answers}) == 1


def test_fault_the_client_retries_a_lost_answer_with_the_same_key(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with AllotmentClient(url) as client:
        real = client._http.request
        calls: list[str | None] = []

        def drop_first_answer(method: str, path: str, **kwargs: object) -> httpx.Response:
            headers = kwargs.get("headers") or {}
            assert isinstance(headers, dict)
            calls.append(headers.get("Idempotency-Key"))
            response = real(method, path, **kwargs)  # type: ignore[arg-type]
            if len(calls) == 1:  # the job is stored, but the answer is lost
                raise httpx.ReadError("connection reset")
            return response

        monkeypatch.setattr(client._http, "request", drop_first_answer)
        job = client.submit(SPEC)
        monkeypatch.undo()
        assert len(calls) == 2 and calls[0] == calls[1] and calls[0]
        assert [j["id"] for j in client.list_jobs()["jobs"]] == [job["id"]]
        with pytest.raises(ClientError):  # a refusal is not retried
            client.submit("name: t\n")


def test_fault_keys_are_each_users_own(engine: Engine) -> None:  # noqa: F811
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as db:
        record(db, "alice", "k", "d", ["j-1"], now=100.0)
    with sessions() as db:
        assert find(db, "alice", "k", now=101.0) is not None
        assert find(db, "bob", "k", now=101.0) is None
        assert find(db, "alice", "k", now=100.0 + 24 * 3600 + 1) is None  # expired


def test_an_expired_key_is_replaced_by_its_reuse_and_pruned_by_upkeep(
    engine: Engine,  # noqa: F811
) -> None:
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    later = 100.0 + 24 * 3600 + 1
    with sessions.begin() as db:
        record(db, "alice", "k", "d", ["j-1"], now=100.0)
        record(db, "bob", "k", "d", ["j-2"], now=100.0)
    with sessions.begin() as db:  # alice's key, expired, is free for a new submission
        record(db, "alice", "k", "e", ["j-3"], now=later)
    with sessions.begin() as db:
        assert prune(db, now=later) == 1  # bob's, expired; alice's new one stays
    with sessions() as db:
        row = find(db, "alice", "k", now=later)
        assert row is not None and row.job_ids == ["j-3"]
        assert find(db, "bob", "k", now=100.0) is None


def test_a_key_recorded_is_found_in_the_same_transaction(engine: Engine) -> None:  # noqa: F811
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as db:  # a group of requests' writes shares one transaction
        assert find(db, "alice", "k", now=100.0) is None
        record(db, "alice", "k", "d", ["j-1"], now=100.0)
        made = find(db, "alice", "k", now=100.5)
        assert made is not None and (made.digest, made.job_ids) == ("d", ["j-1"])
        assert not db.new and not db.identity_map  # no objects: Core statements only


def test_a_submission_reusing_an_expired_key_makes_a_new_job(engine: Engine) -> None:  # noqa: F811
    migrate.upgrade(engine)
    clock = FakeClock()
    app = create_app(
        cluster=load_cluster_text(CLUSTER, source="cluster"),
        store_sessions=session_factory(engine),
        clock=clock,
    )
    with serve(app) as base:
        first = post(base, "/jobs", {"spec": SPEC}, "k-1")
        clock.now += 24 * 3600 + 10  # the key expired: it binds no request any more
        other = post(base, "/jobs", {"spec": SPEC.replace("name: t", "name: u")}, "k-1")
        again = post(base, "/jobs", {"spec": SPEC.replace("name: t", "name: u")}, "k-1")
    assert first.status_code == other.status_code == again.status_code == 201
    assert other.json()["id"] != first.json()["id"]
    assert again.json()["id"] == other.json()["id"]
    with session_factory(engine)() as db:
        made = find(db, "anonymous", "k-1", now=clock.now)
        assert made is not None and made.job_ids == [other.json()["id"]]
