"""Data isolation at submit: a job may mount only its tenant's data scopes; a refusal is
a 422 ``mount_not_allowed`` naming the path and the scopes, and is audited as denied.
The cluster runs containers (plain processes refuse every mount before scopes count)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from allotment.api.app import create_app
from allotment.client import AllotmentClient, ClientError
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import FakeClock, serve

CLUSTER = """\
pools:
  - name: a100
nodes:
  - {name: n0, pool: a100, capacity: {gpu: 4, cpu: 32, memory: 256Gi}}
tenants:
  - {name: mine, data_scopes: [/data/mine, "s3://mine-bucket"]}
  - {name: other, data_scopes: [/data/other-tenant]}
  - {name: bare}
queues:
  - name: root
    children:
      - {name: mine-q, tenant: mine, quota: {a100: {gpu: 2}}}
      - {name: bare-q, tenant: bare, quota: {a100: {gpu: 2}}}
executor:
  runtime: {kind: podman, default_image: "localhost/team/base:1"}
"""


def job(*sources: str, queue: str = "mine-q") -> str:
    mounts = "".join(f"  - {{source: '{s}', target: /in/{i}}}\n" for i, s in enumerate(sources))
    return (
        f"name: t\nqueue: {queue}\ncommand: [python, t.py]\n"
        "replicas:\n  - {name: w, count: 1, resources: {gpu: 1}}\n"
        + ("mounts:\n" + mounts if sources else "")
    )


@pytest.fixture
def client(tmp_path: Path) -> Iterator[AllotmentClient]:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    migrate.upgrade(engine)
    app = create_app(
        cluster=load_cluster_text(CLUSTER, source="cluster"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
    )
    with serve(app) as url, AllotmentClient(url, timeout=10) as c:
        yield c
    engine.dispose()


@pytest.mark.parametrize(
    "source", ["/data/other-tenant", "/data/mine/../other", "/data/mine2", "/data/mine/../../etc"]
)
def test_mounting_outside_the_tenants_scopes_is_refused(
    client: AllotmentClient, source: str
) -> None:
    with pytest.raises(ClientError) as caught:
        client.submit(job("/data/mine/ok", source))
    error = caught.value
    assert error.status == 422 and error.code == "mount_not_allowed"
    assert source in error.message and "/data/mine" in error.message
    assert error.fields["tenant"] == "mine"
    assert error.fields["scopes"] == ["/data/mine", "s3://mine-bucket"]
    assert [i["path"] for i in error.fields["issues"]] == ["mounts.1.source"]
    assert client.list_jobs()["jobs"] == []
    (record,) = client.audit(action="job.submit")["records"]
    assert record["result"] == "denied" and record["tenant"] == "mine"
    assert record["detail"]["code"] == "mount_not_allowed"


def test_mounting_inside_the_scopes_is_accepted(client: AllotmentClient) -> None:
    submitted = client.submit(job("/data/mine", "/data//mine/a/../b/"))
    assert submitted["state"] == "pending"


def test_an_object_store_scope_passes_the_scope_check_but_podman_cannot_mount_it(
    client: AllotmentClient,
) -> None:
    with pytest.raises(ClientError) as caught:
        client.submit(job("/data/mine", "s3://mine-bucket/x"))
    error = caught.value
    assert error.status == 422 and error.code == "invalid_config"
    assert [i["path"] for i in error.fields["issues"]] == ["mounts.1.source"]
    assert "object-store" in error.message
    assert client.list_jobs()["jobs"] == []


def test_a_plain_process_cluster_refuses_every_mount(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    migrate.upgrade(engine)
    plain = CLUSTER.split("executor:")[0]
    app = create_app(
        cluster=load_cluster_text(plain, source="cluster"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
    )
    with serve(app) as url, AllotmentClient(url, timeout=10) as c:
        with pytest.raises(ClientError) as caught:
            c.submit(job("/data/mine"))
        assert caught.value.status == 422 and caught.value.code == "invalid_config"
        assert "plain processes" in caught.value.message
        assert c.list_jobs()["jobs"] == []
    engine.dispose()


def test_a_tenant_without_scopes_may_mount_nothing(client: AllotmentClient) -> None:
    assert client.submit(job(queue="bare-q"))["state"] == "pending"
    with pytest.raises(ClientError) as caught:
        client.submit(job("/data/mine", queue="bare-q"))
    assert caught.value.code == "mount_not_allowed"
    assert "no data scopes" in caught.value.message
