"""``GET /api/v1/images`` against a real server with real tokens: a platform admin sees
every image on every node; anyone else only the images their tenant may run, so other
tenants' image names never show; plain processes and executors that cannot tell
answer ``known: false`` with a message; the runtime's enforcement is shown to all.
One test asks a real :class:`LocalExecutor` with the Podman runtime."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.app import create_app
from allotment.api.auth import StoreTokens
from allotment.client import AllotmentClient
from allotment.domain.executor import RuntimeSpec
from allotment.domain.loading import load_cluster_text
from allotment.executors.containers import PROCESS_ENFORCEMENT
from allotment.executors.local import LocalExecutor
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import serve
from tests.api.tenancy import issue
from tests.containers import images as test_images

BASE = "registry.example.com/base:1"
VISION_TRAIN = "registry.example.com/vision/train:2.1"
VISION_EVAL = "registry.example.com/vision/eval@sha256:" + "a" * 64
NLP_SECRET = "registry.example.com/nlp/secret-model:7"
STRAY = "docker.io/library/stray:latest"

CLUSTER = f"""
executor:
  runtime: {{kind: podman, default_image: "{BASE}"}}
pools: [{{name: local}}]
nodes:
  - {{name: n1, pool: local, capacity: {{gpu: 2, cpu: 8, memory: 32Gi}}}}
  - {{name: n2, pool: local, capacity: {{gpu: 2, cpu: 8, memory: 32Gi}}}}
tenants:
  - name: vision
    images: ["registry.example.com/vision/*"]
    members: [{{user: bob, role: member}}, {{user: carol, role: viewer}}]
  - name: nlp
    images: ["registry.example.com/nlp/secret-model"]
    members: [{{user: nick, role: member}}]
  - name: bare
queues:
  - name: root
    children:
      - {{name: vision-q, tenant: vision}}
      - {{name: nlp-q, tenant: nlp}}
      - {{name: bare-q, tenant: bare}}
"""

ON_NODES = {
    "n1": [BASE, VISION_TRAIN, NLP_SECRET, STRAY],
    "n2": [VISION_EVAL, NLP_SECRET],
}
ENFORCED = {"memory": "enforced by the cgroup v2 memory controller", "cpu": "NOT enforced"}
PEOPLE = {
    "root": (None, "admin"),
    "bob": ("vision", "member"),
    "carol": ("vision", "viewer"),
    "nick": ("nlp", "member"),
    "bea": ("bare", "admin"),
}


@dataclass
class Api:
    url: str
    tokens: dict[str, str]
    calls: list[str]
    """One entry per call of the ``images`` callable."""

    def get(self, user: str) -> dict[str, object]:
        with AllotmentClient(self.url, self.tokens[user], timeout=20) as client:
            return client.images()


@contextmanager
def api(
    tmp_path: Path,
    cluster_text: str = CLUSTER,
    *,
    images: Callable[[], Mapping[str, Sequence[str]] | None] | None = None,
    enforcement: Callable[[], Mapping[str, str]] | None = None,
    people: Mapping[str, tuple[str | None, str]] = PEOPLE,
) -> Iterator[Api]:
    """A real server for ``cluster_text`` with a token for each of ``people``; the
    calls of ``images`` are counted in :attr:`Api.calls`."""
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions: sessionmaker[Session] = session_factory(engine)
    calls: list[str] = []

    def counted() -> Mapping[str, Sequence[str]] | None:
        calls.append("images")
        assert images is not None
        return images()

    app = create_app(
        cluster=load_cluster_text(cluster_text, source="cluster"),
        store_sessions=sessions,
        clock=time.time,
        authenticator=StoreTokens(sessions, clock=time.time),
        images=counted if images is not None else None,
        enforcement=enforcement,
    )
    tokens = {
        user: issue(sessions, user, tenant, role)[1] for user, (tenant, role) in people.items()
    }
    try:
        with serve(app) as url:
            yield Api(url=url, tokens=tokens, calls=calls)
    finally:
        engine.dispose()


def by_node(body: Mapping[str, object]) -> dict[str, list[str]]:
    nodes = body["nodes"]
    assert isinstance(nodes, list)
    return {entry["node"]: entry["images"] for entry in nodes}


def test_a_platform_admin_sees_every_image_on_every_node(tmp_path: Path) -> None:
    with api(tmp_path, images=lambda: ON_NODES, enforcement=lambda: ENFORCED) as server:
        body = server.get("root")
    assert body["runtime"] == "podman" and body["known"] is True
    assert body["message"] is None and body["allowed"] is None
    assert by_node(body) == {
        "n1": sorted([BASE, VISION_TRAIN, NLP_SECRET, STRAY]),
        "n2": sorted([VISION_EVAL, NLP_SECRET]),
    }
    assert body["enforcement"] == ENFORCED


@pytest.mark.parametrize("user", ["bob", "carol"])
def test_a_tenant_sees_only_the_images_it_may_run(tmp_path: Path, user: str) -> None:
    with api(tmp_path, images=lambda: ON_NODES, enforcement=lambda: ENFORCED) as server:
        body = server.get(user)
        raw = httpx.get(
            f"{server.url}/api/v1/images",
            headers={"Authorization": f"Bearer {server.tokens[user]}"},
            timeout=20,
        ).text
    assert body["known"] is True
    # The default image and its own patterns (a digest matches a pattern of the
    # repository); every node is listed, even one with nothing it may run.
    assert by_node(body) == {"n1": [BASE, VISION_TRAIN], "n2": [VISION_EVAL]}
    assert body["allowed"] == [BASE, "registry.example.com/vision/*"]
    assert body["enforcement"] == ENFORCED
    # Nothing of another tenant's images, nor of images nobody was allowed, leaks.
    assert "nlp" not in raw and "secret-model" not in raw and "stray" not in raw


def test_another_tenant_sees_its_own_and_a_tenant_without_patterns_the_default(
    tmp_path: Path,
) -> None:
    with api(tmp_path, images=lambda: ON_NODES) as server:
        nick, bea = server.get("nick"), server.get("bea")
    assert by_node(nick) == {"n1": [BASE, NLP_SECRET], "n2": [NLP_SECRET]}
    assert nick["allowed"] == [BASE, "registry.example.com/nlp/secret-model"]
    assert by_node(bea) == {"n1": [BASE], "n2": []}
    assert bea["allowed"] == [BASE]
    assert bea["enforcement"] == {}


def test_plain_processes_have_no_images_and_the_executor_is_not_asked(tmp_path: Path) -> None:
    process = CLUSTER.replace("kind: podman", "kind: process")
    with api(
        tmp_path, process, images=lambda: ON_NODES, enforcement=lambda: PROCESS_ENFORCEMENT
    ) as server:
        admin, member = server.get("root"), server.get("bob")
    assert server.calls == []
    for body in (admin, member):
        assert body["runtime"] == "process" and body["known"] is False
        assert body["nodes"] == [] and body["allowed"] is None
        assert "plain processes" in str(body["message"])
        assert body["enforcement"] == PROCESS_ENFORCEMENT  # not secret: everyone sees it


def test_an_executor_that_cannot_tell_is_unknown(tmp_path: Path) -> None:
    with api(tmp_path, images=lambda: None) as server:
        admin, member = server.get("root"), server.get("bob")
    assert len(server.calls) == 2
    for body in (admin, member):
        assert body["runtime"] == "podman" and body["known"] is False
        assert body["nodes"] == [] and "cannot tell" in str(body["message"])
    assert member["allowed"] == [BASE, "registry.example.com/vision/*"]


def test_without_an_images_source_the_images_are_unknown(tmp_path: Path) -> None:
    with api(tmp_path) as server:
        body = server.get("root")
    assert body["known"] is False and body["nodes"] == []
    assert "cannot ask its executor" in str(body["message"])
    assert body["enforcement"] == {}


def test_a_token_is_needed(tmp_path: Path) -> None:
    with api(tmp_path, images=lambda: ON_NODES) as server:
        response = httpx.get(f"{server.url}/api/v1/images", timeout=20)
    assert response.status_code == 401
    assert server.calls == []


# ---------------------------------------------------------------- a real executor

REPOSITORY = test_images.TOOLS.rsplit(":", 1)[0]
REAL = f"""
executor:
  runtime: {{kind: podman}}
pools: [{{name: local}}]
nodes: [{{name: box, pool: local, capacity: {{gpu: 0, cpu: 4, memory: 8Gi}}}}]
tenants:
  - name: vision
    images: ["{REPOSITORY}"]
  - name: bare
queues:
  - name: root
    children:
      - {{name: vision-q, tenant: vision}}
      - {{name: bare-q, tenant: bare}}
"""


@pytest.fixture(scope="module")
def podman_images() -> None:
    reasons = test_images.missing()
    if reasons:
        pytest.skip("containers cannot be tested here: needs " + ", ".join(reasons))
    test_images.ensure_podman()
    test_images.build_images()


@pytest.mark.usefixtures("podman_images")
def test_a_local_podman_executor_lists_the_images_it_holds(tmp_path: Path) -> None:
    executor = LocalExecutor(tmp_path / "state", runtime=RuntimeSpec(kind="podman"))
    people = {"root": (None, "admin"), "bob": ("vision", "member"), "bea": ("bare", "admin")}
    with api(
        tmp_path, REAL, images=executor.images, enforcement=executor.enforcement, people=people
    ) as server:
        admin, bob, bea = server.get("root"), server.get("bob"), server.get("bea")
    # Every node of a local cluster is this machine: one entry, named "local".
    assert admin["known"] is True and list(by_node(admin)) == ["local"]
    assert {test_images.TOOLS, test_images.PLAIN} <= set(by_node(admin)["local"])
    # Only the repository vision may run (other tests may add tags of it, never PLAIN).
    seen = by_node(bob)["local"]
    assert test_images.TOOLS in seen and test_images.PLAIN not in seen
    assert all(image.startswith(REPOSITORY + ":") for image in seen)
    assert by_node(bea) == {"local": []}
    assert set(admin["enforcement"]) == {
        "image",
        "mounts",
        "network",
        "memory",
        "cpu",
        "identity",
        "devices",
    }
    assert admin["enforcement"] == bob["enforcement"]
