"""The API through the typed client, against a real HTTP server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from allotment.api.app import create_app
from allotment.api.service import MAX_BATCH
from allotment.client import AllotmentClient, ClientError
from allotment.domain.loading import load_cluster
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import EXAMPLES, Server, serve

JOB = """\
name: {name}
queue: {queue}
replicas:
  - {{name: worker, count: 1, resources: {{gpu: 1}}}}
command: [python, train.py]
"""


def job(name: str = "train", queue: str = "default") -> str:
    return JOB.format(name=name, queue=queue)


def test_submit_makes_a_pending_job_with_its_event_trail(client: AllotmentClient) -> None:
    submitted = client.submit(job())
    assert submitted["state"] == "pending"
    assert submitted["queue"] == "default"
    assert submitted["tenant"] == "me"
    assert submitted["priority_class"] == "training"  # the queue's default
    assert submitted["id"].startswith("j-")

    assert client.get_job(submitted["id"]) == submitted
    trail = [(e["from_state"], e["to_state"]) for e in client.events(submitted["id"])]
    assert trail == [(None, "submitted"), ("submitted", "pending")]


def test_submit_answers_201(server: Server) -> None:
    response = httpx.post(f"{server.url}/api/v1/jobs", json={"spec": job()})
    assert response.status_code == 201
    assert response.json()["state"] == "pending"


def test_submit_accepts_json_text(client: AllotmentClient) -> None:
    spec = {
        "name": "j",
        "queue": "batch",
        "replicas": [{"name": "w", "count": 1, "resources": {"gpu": 1}}],
    }
    assert client.submit(json.dumps(spec))["priority_class"] == "experiment"


def test_submit_many_stores_all_in_order(client: AllotmentClient) -> None:
    jobs = client.submit_many([job("a"), job("b", "batch"), job("c")])
    assert [j["name"] for j in jobs] == ["a", "b", "c"]
    assert {j["state"] for j in jobs} == {"pending"}
    listed = client.list_jobs()["jobs"]
    assert [j["id"] for j in listed] == [j["id"] for j in jobs]
    trail = [(e["from_state"], e["to_state"]) for e in client.events(jobs[1]["id"])]
    assert trail == [(None, "submitted"), ("submitted", "pending")]


def test_submit_many_is_all_or_nothing(client: AllotmentClient) -> None:
    with pytest.raises(ClientError) as err:
        client.submit_many([job("a"), job("b", "nowhere"), job("c")])
    assert err.value.status == 422
    assert err.value.code == "invalid_config"
    assert err.value.fields["source"] == "specs.1"
    assert client.list_jobs()["jobs"] == []


def test_submit_many_over_the_limit_is_413(client: AllotmentClient) -> None:
    with pytest.raises(ClientError) as err:
        client.submit_many([job(f"j{i}") for i in range(MAX_BATCH + 1)])
    assert err.value.status == 413
    assert err.value.code == "batch_too_large"
    assert client.list_jobs()["jobs"] == []


def test_submit_many_refuses_an_empty_batch(server: Server) -> None:
    response = httpx.post(f"{server.url}/api/v1/jobs:batch", json={"specs": []})
    assert response.status_code == 422


def test_list_filters_and_pages(client: AllotmentClient) -> None:
    ids = [client.submit(job(f"d{i}", "default"))["id"] for i in range(5)]
    batch = client.submit(job("b", "batch"))["id"]

    assert [j["id"] for j in client.list_jobs()["jobs"]] == [*ids, batch]
    assert [j["id"] for j in client.list_jobs(queue="batch")["jobs"]] == [batch]
    assert len(client.list_jobs(states=["pending"])["jobs"]) == 6
    assert client.list_jobs(states=["running"])["jobs"] == []

    seen: list[str] = []
    after = None
    while True:
        page = client.list_jobs(queue="default", limit=2, after=after)
        seen += [j["id"] for j in page["jobs"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == ids


def test_list_refuses_bad_parameters(client: AllotmentClient) -> None:
    with pytest.raises(ClientError) as too_many:
        client.list_jobs(limit=501)
    assert (too_many.value.status, too_many.value.code) == (422, "invalid_request")
    assert "limit" in too_many.value.message
    with pytest.raises(ClientError) as bad_state:
        client.list_jobs(states=["sleeping"])
    assert bad_state.value.code == "invalid_request"
    with pytest.raises(ClientError) as bad_cursor:
        client.list_jobs(after="j-nope")
    assert (bad_cursor.value.status, bad_cursor.value.code) == (404, "not_found")


def test_unknown_job_is_404(client: AllotmentClient) -> None:
    for call in (client.get_job, client.events):
        with pytest.raises(ClientError) as caught:
            call("j-0000")
        assert (caught.value.status, caught.value.code) == (404, "not_found")
        assert "j-0000" in caught.value.message


def test_typo_key_names_key_and_line_and_creates_nothing(client: AllotmentClient) -> None:
    text = job() + "max_runtmie: 2h\n"
    with pytest.raises(ClientError) as caught:
        client.submit(text)
    err = caught.value
    assert 400 <= err.status < 500
    assert err.code == "invalid_config"
    assert "max_runtmie" in err.message
    assert "line 6" in err.message
    assert any(i["line"] == 6 for i in err.fields["issues"])
    assert client.list_jobs()["jobs"] == []


def test_unknown_queue_lists_the_queues(client: AllotmentClient) -> None:
    with pytest.raises(ClientError) as caught:
        client.submit(job(queue="nope"))
    err = caught.value
    assert 400 <= err.status < 500
    assert "nope" in err.message
    assert "batch" in err.message and "default" in err.message
    assert client.list_jobs()["jobs"] == []


def test_malformed_yaml_is_a_user_error(client: AllotmentClient) -> None:
    with pytest.raises(ClientError) as caught:
        client.submit("name: [unclosed\n")
    assert 400 <= caught.value.status < 500


def test_malformed_json_is_invalid_request(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/api/v1/jobs",
        content=b'{"spec": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_request"
    assert set(body) == {"code", "message", "fields"}


def test_unknown_request_key_is_refused(server: Server) -> None:
    response = httpx.post(f"{server.url}/api/v1/jobs", json={"spec": job(), "specc": 1})
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_request"
    assert "specc" in response.json()["message"]


def test_oversized_body_is_413(server: Server) -> None:
    big = json.dumps({"spec": "x" * (1024 * 1024 + 10)})
    response = httpx.post(
        f"{server.url}/api/v1/jobs", content=big, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["code"] == "body_too_large"


def test_oversized_streamed_body_is_413(server: Server) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b"x" * 65536

    response = httpx.post(f"{server.url}/api/v1/jobs", content=chunks())
    assert response.status_code == 413


def test_queues_tree_has_nominal_gpus(client: AllotmentClient) -> None:
    (root,) = client.queues()
    assert root["name"] == "workstation"
    assert root["nominal_gpu"] == {"local": 2}
    leaves = {q["name"]: q for q in root["children"]}
    assert set(leaves) == {"default", "batch"}
    assert leaves["default"]["nominal_gpu"] == {"local": 1}
    assert leaves["default"]["leaf"] is True


def test_healthz(client: AllotmentClient) -> None:
    assert client.health() == {"status": "ok"}


def test_openapi_lists_the_routes(server: Server) -> None:
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert {
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/events",
        "/api/v1/queues",
        "/api/v1/healthz",
    } <= set(paths)
    assert {"get", "post"} <= set(paths["/api/v1/jobs"])


def test_unreachable_server_is_a_client_error() -> None:
    with (
        AllotmentClient("http://127.0.0.1:9", timeout=2) as c,
        pytest.raises(ClientError) as caught,
    ):
        c.queues()
    assert (caught.value.code, caught.value.status) == ("unreachable", 0)


def test_unexpected_error_is_500_without_a_trace(tmp_path: Path) -> None:
    # A store that was never migrated: every query fails inside SQLAlchemy.
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    app = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(engine),
    )
    with serve(app) as url, AllotmentClient(url, timeout=10) as c:
        with pytest.raises(ClientError) as caught:
            c.get_job("j-1")
        assert (caught.value.status, caught.value.code) == (500, "internal")
        assert "Traceback" not in caught.value.message
        assert "sqlite" not in caught.value.message.lower()
    engine.dispose()
