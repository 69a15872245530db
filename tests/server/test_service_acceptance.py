"""Inference services tried as a new user would: ``allot up`` as a process, a one-file
Python HTTP service submitted with ``allot submit``, and real HTTP through the API
server's proxy."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Up
from tests.server.test_acceptance import allot, allot_json

APP = Path(__file__).resolve().parent / "apps" / "web.py"

# One node of four GPUs; tenant vision's queue may use two of them, nlp's two.
CLUSTER = """
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 4, cpu: 16, memory: 32Gi}}]
tenants: [{name: vision, public_services: true}, {name: nlp}]
queues:
  - {name: serving, tenant: vision, quota: {local: {gpu: 2}}, borrowing_limit: {local: {gpu: 0}}}
  - {name: nlp-serving, tenant: nlp, quota: {local: {gpu: 2}}}
"""


def started(up: Up, *extra: str) -> dict[str, str]:
    """Start ``allot up`` (with ``extra`` options); return tokens of a vision member and
    an nlp member."""
    (up.root / "cluster.yaml").write_text(CLUSTER)
    up.start("-f", str(up.root / "cluster.yaml"), *extra)
    with up.client() as admin:
        return {
            tenant: admin.create_token(user=f"{tenant}-member", tenant=tenant, role="member")[
                "token"
            ]
            for tenant in ("vision", "nlp")
        }


def service_file(up: Up, name: str, service: dict[str, Any], **extra: Any) -> str:
    path = up.root / f"{name}.json"
    spec = {
        "name": name,
        "queue": "serving",
        "type": "service",
        "replicas": [{"count": 1, "resources": {"gpu": 1}}],
        "command": [sys.executable, str(APP)],
        "service": {"health": {"path": "/health", "interval": "0.3s"}, **service},
        **extra,
    }
    path.write_text(json.dumps(spec))
    return str(path)


def show(up: Up, name: str) -> dict[str, Any]:
    found: dict[str, Any] = allot_json(up, "services", name)
    return found


def wait_service(up: Up, name: str, test: Any, timeout: float = 45.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        found = show(up, name)
        if test(found):
            return found
        time.sleep(0.2)
    raise AssertionError(f"service {name} never got there: {json.dumps(found)[:2000]}")


@contextmanager
def steady_load(url: str, headers: dict[str, str]) -> Iterator[list[int]]:
    """One client calling ``url`` again and again until the block ends; yields the
    status codes (0: no answer)."""
    results: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(headers=headers, timeout=10) as client:
            while not stop.is_set():
                try:
                    answer = client.get(url)
                except httpx.HTTPError:
                    results.append(0)
                    continue
                results.append(answer.status_code)
                if answer.status_code != 200:
                    print("not 200:", answer.status_code, answer.text[:300])

    worker = threading.Thread(target=load)
    worker.start()
    try:
        yield results
    finally:
        stop.set()
        worker.join(timeout=30)


def test_service_endpoint_answers_with_a_token_only_and_heals_a_killed_replica(up: Up) -> None:
    tokens = started(up)
    vision = {"ALLOT_TOKEN": tokens["vision"]}
    up.env_overrides.update(vision)
    out = allot(up, "submit", service_file(up, "web", {"replicas": {"min": 2, "max": 2}}))
    url = f"{up.url}/svc/vision/web/"
    assert out.stdout.strip() == f"service vision/web: {url}"
    service = wait_service(up, "web", lambda s: s["ready"] == 2)
    assert service["url"] == url
    assert [r["state"] for r in service["replicas"]] == ["running", "running"]

    member = {"Authorization": f"Bearer {tokens['vision']}"}
    answer = httpx.get(url + "hello?x=1", headers=member, timeout=10)
    assert answer.status_code == 200
    body = answer.json()
    assert body["path"] == "/hello" and body["query"] == "x=1"
    assert body["authorization"] is None, "the API token must not reach the replica"
    assert body["prefix"] == "/svc/vision/web"
    assert httpx.get(url + "hello", timeout=10).status_code == 401
    other = httpx.get(url + "hello", headers={"Authorization": f"Bearer {tokens['nlp']}"})
    assert other.status_code == 404 and other.json()["code"] == "not_found"

    # Both replicas answer, in turn.
    pids = {httpx.get(url, headers=member, timeout=10).json()["pid"] for _ in range(6)}
    assert len(pids) == 2

    # Load while one replica is killed: the proxy skips the dead one at once, the
    # controller starts another.
    victim = sorted(pids)[0]
    with steady_load(url + "during-heal", member) as results:
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        healed = wait_service(
            up,
            "web",
            lambda s: (
                s["restarts"] >= 1
                and s["ready"] == 2
                and victim not in {httpx.get(url, headers=member).json()["pid"] for _ in range(4)}
            ),
        )
        time.sleep(0.5)
    failed = [code for code in results if code != 200]
    print(f"heal: {len(results)} requests during the heal, {len(failed)} failed")
    assert len(results) > 20
    assert failed == []
    assert healed["restarts"] == 1
    assert healed["reason"]["code"] == "ready"
    jobs = {r["job"] for r in service["replicas"]} ^ {r["job"] for r in healed["replicas"]}
    assert len(jobs) == 2  # the killed replica's job left, a new one came
    [gone] = jobs & {r["job"] for r in service["replicas"]}
    assert allot_json(up, "get", gone)["state"] == "failed"

    # Submitting the file again, changed, rolls the replicas over: new ones become ready
    # before old ones stop, and the endpoint answers throughout.
    changed = service_file(up, "web", {"replicas": {"min": 2, "max": 2}}, env={"V": "2"})
    with steady_load(url + "during-roll", member) as results:
        assert "service vision/web" in allot(up, "submit", changed).stdout
        rolled = wait_service(
            up,
            "web",
            lambda s: (
                s["generation"] == 2
                and s["ready"] == 2
                and len(s["replicas"]) == 2
                and {r["generation"] for r in s["replicas"]} == {2}
            ),
        )
    failed = [code for code in results if code != 200]
    print(f"rolling update: {len(results)} requests, {len(failed)} failed")
    assert len(results) > 20
    assert failed == []
    assert rolled["restarts"] == 1  # an update is no failure
    old = {r["job"] for r in healed["replicas"]}
    assert {allot_json(up, "get", job)["state"] for job in old} == {"cancelled"}
    healed = rolled

    # Deleting the service stops its replicas and its address.
    allot(up, "delete-service", "web")
    gone_jobs = [allot_json(up, "get", r["job"]) for r in healed["replicas"]]
    assert {j["state"] for j in gone_jobs} == {"cancelled"}
    assert httpx.get(url, headers=member, timeout=10).status_code == 404


def test_a_crashing_service_ends_in_crash_loop_and_its_endpoint_says_why(up: Up) -> None:
    tokens = started(up)
    up.env_overrides["ALLOT_TOKEN"] = tokens["vision"]
    restart = {"backoff": "0.2s", "max_backoff": "1s", "crash_loop_after": 3}
    path = service_file(up, "crashy", {"restart": restart}, env={"CRASH": "1"})
    allot(up, "submit", path)
    service = wait_service(up, "crashy", lambda s: s["reason"]["code"] == "crash_loop")
    assert service["restarts"] >= 3
    assert "replica failures in a row, none became ready" in service["reason"]["message"]
    assert "user_code" in service["reason"]["message"]
    answer = httpx.get(
        f"{up.url}/svc/vision/crashy/",
        headers={"Authorization": f"Bearer {tokens['vision']}"},
        timeout=10,
    )
    assert answer.status_code == 503  # at once: a crash loop has nothing to wait for
    assert answer.json()["code"] == "service_unavailable"
    assert "failures in a row" in answer.json()["message"]


@pytest.mark.parametrize(
    "extra",
    [("--scheduler-thread",), ("--scheduler-process",)],
    ids=["one-process", "scheduler-process"],
)
def test_autoscaling_follows_the_load_within_quota_and_a_scale_up_that_does_not_fit_waits(
    up: Up, extra: tuple[str, ...]
) -> None:
    """Also with the service controller in the scheduler's own process: the proxy's
    request counts reach it there."""
    tokens = started(up, *extra)
    up.env_overrides["ALLOT_TOKEN"] = tokens["vision"]
    scaling = {"target": 1, "window": "1s", "scale_down_delay": "2s"}
    allot(
        up,
        "submit",
        service_file(up, "auto", {"replicas": {"min": 1, "max": 3}, "autoscaling": scaling}),
    )
    wait_service(up, "auto", lambda s: s["ready"] == 1)
    url = f"{up.url}/svc/vision/auto/slow?s=0.3"
    stop = threading.Event()
    codes: list[int] = []

    def load() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {tokens['vision']}"}, timeout=30) as c:
            while not stop.is_set():
                codes.append(c.get(url).status_code)

    workers = [threading.Thread(target=load) for _ in range(6)]
    for worker in workers:
        worker.start()
    try:
        # Six requests in flight at a target of one each: three replicas wanted, the
        # queue's quota (two GPUs, no borrowing) holds two; the third waits, and says why
        # (once a controller turn has seen its job and the scheduler's answer for it).
        busy = wait_service(
            up,
            "auto",
            lambda s: (
                s["desired"] == 3
                and s["ready"] == 2
                and len(s["replicas"]) == 3
                and "replica job" in s["reason"]["message"]
                and "not placed yet" not in s["reason"]["message"]
            ),
        )
        [waiting] = [r for r in busy["replicas"] if not r["ready"]]
        assert waiting["state"] == "pending"
        assert busy["reason"]["code"] == "scaling"
        assert f"replica job {waiting['job']} waits" in busy["reason"]["message"]
        why = allot_json(up, "why", waiting["job"])
        print("third replica waits:", why["reason"]["code"], why["reason"]["message"])
        assert why["reason"]["code"] == "quota_exhausted"
        assert "2 of 2 nominal used" in busy["reason"]["message"]
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
    assert set(codes) == {200}
    # No load: back to one replica after the delay; the others' jobs are cancelled.
    calm = wait_service(up, "auto", lambda s: s["desired"] == 1 and len(s["replicas"]) == 1)
    stopped = {r["job"] for r in busy["replicas"]} - {r["job"] for r in calm["replicas"]}
    assert len(stopped) == 2
    # Drained first (no new requests), then cancelled.
    deadline = time.monotonic() + 20
    states: set[str] = set()
    while time.monotonic() < deadline:
        states = {allot_json(up, "get", job)["state"] for job in stopped}
        if states == {"cancelled"}:
            break
        time.sleep(0.2)
    assert states == {"cancelled"}


def test_a_public_service_answers_without_a_token_where_its_tenant_allows_it(up: Up) -> None:
    tokens = started(up)
    up.env_overrides["ALLOT_TOKEN"] = tokens["vision"]
    allot(up, "submit", service_file(up, "open", {"public": True}))
    assert wait_service(up, "open", lambda s: s["ready"] == 1)["public"] is True
    answer = httpx.get(f"{up.url}/svc/vision/open/hi", timeout=30)
    assert answer.status_code == 200 and answer.json()["path"] == "/hi"
    # A service that is not public still needs a token, and tenant nlp allows none.
    allot(up, "submit", service_file(up, "closed", {}))
    assert httpx.get(f"{up.url}/svc/vision/closed/hi", timeout=30).status_code == 401
    assert httpx.get(f"{up.url}/svc/vision/nothing/hi", timeout=30).status_code == 401
    up.env_overrides["ALLOT_TOKEN"] = tokens["nlp"]
    path = service_file(up, "leak", {"public": True}, queue="nlp-serving")
    refused = allot(up, "submit", path, check=False)
    assert refused.returncode == 1
    assert "tenant nlp does not allow public services" in refused.stderr
