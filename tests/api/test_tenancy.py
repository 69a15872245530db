"""Issue 5's identity acceptance: two tenants with members and real tokens on a live
stack (real server, control loop and local executor). Each tenant submits and reads only
its own jobs, logs and queues; a member cannot change queue policy; a viewer cannot
submit; tokens are refused once revoked or expired, each with its reason."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.auth import Authenticator, StoreTokens
from allotment.client import ClientError
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from tests.api.live import Live, live_stack
from tests.api.tenancy import CLUSTER, People, issue, job

S = JobState
SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Live, People]]:
    def authenticator(sessions: sessionmaker[Session]) -> Authenticator:
        return StoreTokens(sessions, clock=time.time)

    with live_stack(
        tmp_path, cluster=load_cluster_text(CLUSTER), authenticator=authenticator
    ) as live:
        people = People.issued(live.url, live.sessions)
        try:
            yield live, people
        finally:
            people.close()


def refused(call: object, status: int, code: str) -> ClientError:
    assert callable(call)
    with pytest.raises(ClientError) as caught:
        call()
    assert (caught.value.status, caught.value.code) == (status, code), caught.value.message
    return caught.value


def test_each_tenant_sees_and_acts_only_on_its_own(stack: tuple[Live, People]) -> None:
    live, people = stack
    bob, nick = people["bob"], people["nick"]
    vision = bob.submit(job("vision-q", "print('vision secret')", name="v"))["id"]
    nlp = nick.submit(job("nlp-q", "print('nlp secret')", name="n"))["id"]
    assert bob.get_job(vision)["user"] == "bob"  # the submitting principal is recorded
    live.until(vision, {S.SUCCEEDED})
    live.until(nlp, {S.SUCCEEDED})

    # Own jobs, logs and queues are readable; listings hold nothing of the other tenant.
    assert "vision secret" in bob.logs(vision)["data"]
    assert [j["id"] for j in bob.list_jobs()["jobs"]] == [vision]
    assert [j["id"] for j in nick.list_jobs()["jobs"]] == [nlp]
    assert [j["id"] for j in people["carol"].list_jobs()["jobs"]] == [vision]
    assert {j["id"] for j in people["root"].list_jobs()["jobs"]} == {vision, nlp}
    [root] = bob.queues()
    assert [q["name"] for q in root["children"]] == ["vision-q", "vision-solo"]
    [root] = nick.queues()
    assert [q["name"] for q in root["children"]] == ["nlp-q"]

    # The other tenant's job does not exist for them: 404, never 403.
    for call in (
        lambda: bob.get_job(nlp),
        lambda: bob.logs(nlp),
        lambda: bob.events(nlp),
        lambda: bob.why(nlp),
        lambda: bob.cancel(nlp),
        lambda: people["alice"].cancel(nlp),
        lambda: nick.logs(vision),
        lambda: bob.submit(job("nlp-q")),
        lambda: bob.list_jobs(after=nlp),
    ):
        refused(call, 404, "not_found")

    # A batch with one job for the other tenant's queue stores nothing.
    refused(lambda: bob.submit_many([job("vision-q"), job("nlp-q")]), 404, "not_found")
    assert [j["id"] for j in people["root"].list_jobs(queue="vision-q")["jobs"]] == [vision]

    # A member cannot change queue policy; a viewer cannot submit.
    error = refused(lambda: bob.apply_cluster(CLUSTER), 403, "forbidden")
    assert "platform admin" in error.message
    error = refused(lambda: people["carol"].submit(job("vision-q")), 403, "forbidden")
    assert "member" in error.message
    # `submitters` narrows a queue to the users it names.
    refused(lambda: bob.submit(job("vision-solo")), 403, "forbidden")
    assert people["dave"].submit(job("vision-solo"))["user"] == "dave"


def test_nodes_and_why_show_only_own_jobs(stack: tuple[Live, People]) -> None:
    live, people = stack
    mine = people["bob"].submit(job("vision-q", SLEEP, gpus=2))["id"]
    theirs = people["nick"].submit(job("nlp-q", SLEEP, gpus=2))["id"]
    live.until(mine, {S.RUNNING})
    live.until(theirs, {S.RUNNING})
    waiting = people["bob"].submit(job("vision-q", SLEEP, gpus=2))["id"]
    live.step()

    [node] = people["bob"].nodes()
    assert [j["job"] for j in node["jobs"]] == [mine]
    assert node["allocated"]["gpu"] == 4  # the totals count every tenant
    [node] = people["root"].nodes()
    assert {j["job"] for j in node["jobs"]} == {mine, theirs}
    holders = {h["job"] for h in people["bob"].why(waiting)["holders"]}
    assert holders == {mine, "(another tenant)"}

    # A member cancels its own jobs only; the tenant admin any of the tenant's.
    refused(lambda: people["dave"].cancel(mine), 403, "forbidden")
    assert people["alice"].cancel(mine)["state"] == "cancelled"
    assert people["nick"].cancel(theirs)["state"] == "cancelled"
    assert people["bob"].cancel(waiting)["state"] == "cancelled"


def test_tokens_are_issued_listed_and_refused_with_a_reason(stack: tuple[Live, People]) -> None:
    live, people = stack
    alice, root = people["alice"], people["root"]
    issued = alice.create_token(user="bob", tenant="vision", expires_in="30d")
    assert (issued["user"], issued["tenant"], issued["role"]) == ("bob", "vision", "member")
    assert issued["token"].startswith("allot_") and issued["created_by"] == "alice"
    assert issued["expires_at"] is not None

    # Tenant admins see their tenant's tokens, the platform admin all; never the text.
    seen = alice.tokens()
    assert {t["tenant"] for t in seen} == {"vision"} and issued["id"] in {t["id"] for t in seen}
    assert {t["tenant"] for t in root.tokens()} == {None, "vision", "nlp"}
    assert all("token" not in t for t in seen)

    # Roles within the tenant's declared members; platform tokens are the platform's.
    refused(
        lambda: alice.create_token(user="carol", tenant="vision", role="admin"),
        422,
        "invalid_input",
    )
    refused(lambda: alice.create_token(user="mallory", tenant="vision"), 422, "invalid_input")
    refused(lambda: alice.create_token(user="alice", role="admin"), 403, "forbidden")
    refused(lambda: alice.create_token(user="nick", tenant="nlp"), 404, "not_found")
    refused(lambda: root.create_token(user="x", tenant="nowhere"), 404, "not_found")

    def status(token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.get(f"{live.url}/api/v1/jobs", headers=headers, timeout=10)

    assert status(issued["token"]).status_code == 200
    assert alice.revoke_token(issued["id"])["revoked_at"] is not None
    for token, why in (
        (issued["token"], "revoked"),
        (None, "missing"),
        ("allot_not-a-token", "invalid"),
        (issue(live.sessions, "bob", "vision", "member", expires_at=1.0)[1], "expired"),
    ):
        answer = status(token)
        assert answer.status_code == 401
        assert (answer.json()["code"], answer.json()["fields"]["why"]) == ("unauthenticated", why)


def test_an_unknown_queue_names_only_the_queues_the_caller_may_use(
    stack: tuple[Live, People],
) -> None:
    _, people = stack
    error = refused(lambda: people["bob"].submit(job("nowhere")), 422, "invalid_config")
    assert "vision-q" in error.message
    assert "nlp-q" not in error.message and "vision-solo" not in error.message
    error = refused(lambda: people["nick"].submit(job("nowhere")), 422, "invalid_config")
    assert "nlp-q" in error.message and "vision" not in error.message
