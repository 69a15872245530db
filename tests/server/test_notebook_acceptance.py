"""Notebooks tried as a new user would: ``allot notebook`` starts a real JupyterLab as a
job, it opens through the API server's proxy (HTTP and a kernel's websocket), only for
its owner, and left idle past its ``idle_timeout`` it is warned, then reclaimed."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
from websockets.asyncio.client import connect

from tests.server.conftest import Up
from tests.server.test_acceptance import allot, allot_json, wait_for
from tests.server.test_reclaim_acceptance import device_of, set_readings

# One node of two GPUs, telemetry from a file the test writes.
CLUSTER = """
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 2, cpu: 8, memory: 16Gi}}]
telemetry: {source: fake, file: gpus.json, interval: 0.2s, aggregate: 0.5s, retention: 1h}
tenants: [{name: vision}, {name: nlp}]
queues:
  - {name: default, tenant: vision, quota: {local: {gpu: 2}}}
  - {name: nlp, tenant: nlp, quota: {local: {gpu: 0}}}
"""


def started(up: Up) -> dict[str, str]:
    """``allot up``; tokens of two vision members (alice, bob) and an nlp member."""
    (up.root / "cluster.yaml").write_text(CLUSTER)
    set_readings(up, {})
    up.start("-f", str(up.root / "cluster.yaml"))
    with up.client() as admin:
        return {
            user: admin.create_token(user=user, tenant=tenant, role="member")["token"]
            for user, tenant in (("alice", "vision"), ("bob", "vision"), ("nick", "nlp"))
        }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_answering(url: str, headers: dict[str, str], timeout: float = 60.0) -> httpx.Response:
    """JupyterLab takes a few seconds to start: the proxy holds requests meanwhile."""
    answer = httpx.get(url, headers=headers, timeout=timeout)
    assert answer.status_code == 200, answer.text[:500]
    return answer


async def run_code(url: str, token: str, code: str) -> str:
    """Run ``code`` in a kernel through its websocket; return what it printed."""
    session = uuid.uuid4().hex
    msg_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": msg_id,
            "username": "test",
            "session": session,
            "msg_type": "execute_request",
            "version": "5.3",
            "date": datetime.now(UTC).isoformat(),
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "channel": "shell",
        "buffers": [],
    }
    printed = ""
    replied = idle = False
    async with connect(url, additional_headers=bearer(token), proxy=None) as socket:
        await socket.send(json.dumps(request))
        async with asyncio.timeout(60):
            async for raw in socket:
                message = json.loads(raw)
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = message["header"]["msg_type"]
                if kind == "stream":
                    printed += message["content"]["text"]
                replied = replied or kind == "execute_reply"
                idle = idle or (
                    kind == "status" and message["content"]["execution_state"] == "idle"
                )
                if replied and idle:  # the reply and every output of the request are in
                    return printed
    raise AssertionError("no reply from the kernel")


def test_a_notebook_opens_through_the_proxy_for_its_owner_and_is_reclaimed_when_idle(
    up: Up,
) -> None:
    tokens = started(up)
    up.env_overrides["ALLOT_TOKEN"] = tokens["alice"]
    out = allot(up, "notebook", "--gpus", "1", "--idle-timeout", "8s").stdout.splitlines()
    job_id = out[0].strip()
    job = wait_for(up, job_id, {"running"}, timeout=30)
    jupyter = job["spec"]["env"]["JUPYTER_TOKEN"]
    base = f"{up.url}/nb/{job_id}/"
    assert out[1].startswith(f"open: {base}lab?token={jupyter}")
    assert allot_json(up, "get", job_id)["url"] == f"{base}lab?token={jupyter}"

    # JupyterLab answers through the proxy, for its owner only.
    status = wait_answering(f"{base}api/status?token={jupyter}", bearer(tokens["alice"]))
    assert status.json()["kernels"] == 0
    page = httpx.get(f"{base}lab?token={jupyter}", headers=bearer(tokens["alice"]), timeout=30)
    assert page.status_code == 200 and "JupyterLab" in page.text
    assert httpx.get(f"{base}api/status").status_code == 401
    other_member = httpx.get(f"{base}api/status", headers=bearer(tokens["bob"]))
    assert other_member.status_code == 403 and other_member.json()["code"] == "forbidden"
    other_tenant = httpx.get(f"{base}api/status", headers=bearer(tokens["nick"]))
    assert other_tenant.status_code == 404

    # A kernel runs code through the proxied websocket. It is started as JupyterLab's
    # page in a browser starts one: signed in to Allotment by the dashboard's cookie,
    # with JupyterLab's own token in its Authorization header and the page's Origin.
    with httpx.Client(cookies={"allot_token": tokens["alice"]}, timeout=30) as browser:
        kernel = browser.post(
            f"{base}api/kernels",
            headers={"Authorization": f"token {jupyter}", "Origin": up.url},
        )
    assert kernel.status_code == 201, kernel.text
    channels = f"ws://127.0.0.1:{up.port}/nb/{job_id}/api/kernels/{kernel.json()['id']}/channels"
    printed = asyncio.run(run_code(f"{channels}?token={jupyter}", tokens["alice"], "print(6 * 7)"))
    assert printed.strip() == "42"

    # Its GPU sits idle and no code runs: warned, then reclaimed, with events.
    set_readings(up, {f"box/{device_of(up, job_id)}": {"utilization": 0, "memory": "1Gi"}})
    wait_for(up, job_id, {"reclaimed"}, timeout=60)
    events = allot_json(up, "events", job_id)
    kinds = [e["kind"] if e["kind"] != "transition" else e["to_state"] for e in events]
    assert "idle_warning" in kinds and kinds.index("idle_warning") < kinds.index("reclaimed")
    reclaimed: dict[str, Any] = next(e for e in events if e["to_state"] == "reclaimed")
    assert "no notebook activity" in reclaimed["message"]
    assert reclaimed["detail"]["notebook_active_at"] >= job["updated_at"] - 60
    gone = httpx.get(f"{base}api/status", headers=bearer(tokens["alice"]), timeout=10)
    assert gone.status_code == 503 and "reclaimed" in gone.json()["message"]
