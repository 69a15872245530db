"""The audit trail through the API and ``allot audit``, on SQLite and PostgreSQL: every
write and sensitive read is recorded (refusals too), filters work, a tenant's principal
sees only its tenant, and tampering with a row makes ``--verify`` fail naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from allotment.api.app import create_app
from allotment.api.auth import Principal
from allotment.cli.main import app as cli
from allotment.client import AllotmentClient, ClientError
from allotment.domain.loading import load_cluster, load_cluster_text
from allotment.domain.tenancy import Role
from allotment.store import migrate
from allotment.store.db import session_factory
from tests.api.conftest import EXAMPLES, FakeClock, serve
from tests.store.conftest import engine  # noqa: F401  (the SQLite/PostgreSQL fixture)

JOB = """\
name: train
queue: default
replicas:
  - {name: worker, count: 1, resources: {gpu: 1}}
command: [python, train.py]
"""

JOB_OTHER = JOB.replace("queue: default", "queue: elsewhere")

CLUSTER = """\
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 2, cpu: 8, memory: 16Gi}}]
tenants: [{name: me}, {name: other}]
queues:
  - {name: default, tenant: me, quota: {local: {gpu: 1}}}
  - {name: elsewhere, tenant: other, quota: {local: {gpu: 1}}}
"""

runner = CliRunner()


class Tokens:
    """Test tokens: ``user/tenant`` speaks for that user as the tenant's admin, ``root``
    for a platform admin."""

    def authenticate(self, token: str) -> Principal | None:
        user, _, tenant = token.partition("/")
        return Principal(user=user, tenant=tenant or None, role=Role.ADMIN, token_id=None)


@dataclass
class Stack:
    url: str
    engine: Engine


@pytest.fixture
def stack(engine: Engine) -> Iterator[Stack]:  # noqa: F811
    migrate.upgrade(engine)
    app = create_app(
        cluster=load_cluster_text(CLUSTER, source="test"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
        authenticator=Tokens(),
    )
    with serve(app) as url:
        yield Stack(url=url, engine=engine)


def as_(stack: Stack, who: str = "root") -> AllotmentClient:
    return AllotmentClient(stack.url, who, timeout=10)


def allot(stack: Stack, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(cli, [*args, "--url", stack.url, "--token", "root"])
    return result.exit_code, result.stdout, result.stderr


def test_writes_reads_and_refusals_are_recorded(stack: Stack) -> None:
    with as_(stack, "ada/me") as ada:
        job = ada.submit(JOB)
        ada.cancel(job["id"])
        with pytest.raises(ClientError):
            ada.cancel(job["id"])  # already ended: 409
        with pytest.raises(ClientError):
            ada.submit("queue: nowhere\n")
        ada.logs(job["id"])
        ada.list_jobs()  # not audited
        records = ada.audit()["records"]
    seen = [(r["user"], r["tenant"], r["action"], r["object"], r["result"]) for r in records]
    assert seen == [
        ("ada", "me", "job.submit", job["id"], "ok"),
        ("ada", "me", "job.cancel", job["id"], "ok"),
        ("ada", "me", "job.cancel", job["id"], "already_ended"),
        ("ada", "me", "job.submit", "jobs", "invalid_config"),
        ("ada", "me", "job.logs", job["id"], "ok"),
    ]
    assert all(r["source"] == "127.0.0.1" for r in records)
    assert records[0]["detail"]["status"] == 201
    assert records[2]["detail"]["status"] == 409
    assert "already" in records[2]["detail"]["message"]


def test_a_platform_principals_records_take_the_jobs_tenant(stack: Stack) -> None:
    with as_(stack) as root:
        job = root.submit(JOB)
        (record,) = root.audit(action="job.submit")["records"]
    assert (record["user"], record["tenant"], record["object"]) == ("root", "me", job["id"])


def test_filters_and_paging(stack: Stack) -> None:
    with as_(stack, "ada/me") as ada, as_(stack, "bob/other") as bob:
        first = ada.submit(JOB)
        bob.submit(JOB_OTHER)
        ada.cancel(first["id"])
        assert [r["action"] for r in ada.audit(user="ada")["records"]] == [
            "job.submit",
            "job.cancel",
        ]
        assert [r["id"] for r in ada.audit(object=first["id"])["records"]] == [1, 3]
        page = ada.audit(limit=1)
        assert [r["id"] for r in page["records"]] == [1] and page["next_after"] == 1
        assert [r["id"] for r in ada.audit(after=1, limit=1)["records"]] == [3]
        at = ada.audit(object=first["id"])["records"][1]["at"]
        assert next(r["id"] for r in ada.audit(since=at)["records"]) == 3
        assert ada.audit(until=0)["records"] == []


def test_a_tenant_sees_only_its_own_records(stack: Stack) -> None:
    with as_(stack, "ada/me") as ada, as_(stack, "eve/other") as eve, as_(stack, "root") as root:
        ada.submit(JOB)
        eve.submit(JOB_OTHER)
        assert {r["user"] for r in eve.audit()["records"]} == {"eve"}
        assert eve.audit(tenant="me")["records"] == []
        assert {r["tenant"] for r in ada.audit()["records"]} == {"me"}
        assert {r["user"] for r in root.audit()["records"]} >= {"ada", "eve"}


def test_verify_a_clean_chain(stack: Stack) -> None:
    with as_(stack) as client:
        client.submit(JOB)
        client.submit(JOB)
    code, out, err = allot(stack, "audit", "--verify")
    assert code == 0, err
    assert "intact" in out
    code, out, _ = allot(stack, "audit", "--verify", "-o", "json")
    data = json.loads(out)
    assert data["ok"] is True and data["first_bad"] is None and data["checked"] >= 2


TAMPERING = {
    "edit": ["UPDATE audit_records SET result = 'ok' WHERE id = 2"],
    "delete": ["DELETE FROM audit_records WHERE id = 2"],
    "swap": [
        "UPDATE audit_records SET id = -1 WHERE id = 2",
        "UPDATE audit_records SET id = 2 WHERE id = 3",
        "UPDATE audit_records SET id = 3 WHERE id = -1",
    ],
}
NAMED = {"edit": (2, "changed"), "delete": (3, "missing"), "swap": (2, "prev_hash")}


@pytest.mark.parametrize("how", sorted(TAMPERING))
def test_tampering_makes_verify_fail_and_name_the_record(stack: Stack, how: str) -> None:
    with as_(stack, "ada/me") as ada:
        job = ada.submit(JOB)
        with pytest.raises(ClientError):
            ada.cancel("j-nope")  # record 2: refused
        ada.cancel(job["id"])
        ada.logs(job["id"])
    assert allot(stack, "audit", "--verify")[0] == 0
    with stack.engine.begin() as connection:
        for statement in TAMPERING[how]:
            connection.execute(text(statement))
    code, out, err = allot(stack, "audit", "--verify")
    bad_id, word = NAMED[how]
    assert code == 1
    assert f"broken at record {bad_id}:" in err and word in err
    code, out, _ = allot(stack, "audit", "--verify", "-o", "json")
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["first_bad"]["id"] == bad_id


def test_cli_lists_with_filters(stack: Stack) -> None:
    with as_(stack, "ada/me") as ada:
        job = ada.submit(JOB)
    code, out, err = allot(stack, "audit", "--user", "ada", "--since", "3650d")
    assert code == 0, err
    assert "job.submit" in out and job["id"] in out
    code, out, _ = allot(stack, "audit", "--action", "job.cancel", "-o", "json")
    assert code == 0 and json.loads(out)["records"] == []
    code, _, err = allot(stack, "audit", "--since", "soon")
    assert code == 1 and "--since" in err


def test_reading_the_trail_is_recorded(stack: Stack) -> None:
    with as_(stack) as root:
        root.audit()
        root.verify_audit()
        actions = [r["action"] for r in root.audit()["records"]]
    assert actions[:2] == ["audit.read", "audit.verify"]


def test_only_a_platform_admin_verifies_the_whole_chain(stack: Stack) -> None:
    with as_(stack, "ada/me") as ada, pytest.raises(ClientError) as info:
        ada.verify_audit()
    assert info.value.status == 403


def test_disabled_audit_records_nothing(tmp_path: Path) -> None:
    from allotment.store.db import make_engine

    eng = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    migrate.upgrade(eng)
    app = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(eng),
        clock=FakeClock(),
        audit=False,
    )
    with serve(app) as url, AllotmentClient(url) as client:
        client.submit(JOB)
        assert client.audit()["records"] == []
    eng.dispose()


def test_a_refused_token_is_recorded_as_denied(tmp_path: Path) -> None:
    from allotment.api.auth import AdminDigest, token_digest
    from allotment.store.db import make_engine

    eng = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    migrate.upgrade(eng)
    app = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(eng),
        clock=FakeClock(),
        authenticator=AdminDigest(token_digest("sesame"), user="root"),
    )
    with serve(app) as url:
        with AllotmentClient(url, "wrong") as intruder, pytest.raises(ClientError):
            intruder.submit(JOB)
        with AllotmentClient(url, "sesame") as admin:
            (record,) = admin.audit()["records"][:1]
    assert (record["action"], record["result"], record["user"]) == (
        "job.submit",
        "denied",
        "anonymous",
    )
    assert record["detail"]["code"] == "unauthenticated"
    eng.dispose()
