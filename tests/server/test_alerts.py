"""Issue 7's alert acceptance, as a new user would try it: ``allot up`` as a process, a
tenant whose webhook is a real receiver on 127.0.0.1, and a job that waits past its
queue's ``max_wait`` of one second: exactly one webhook call, signed, seen in ``allot
alerts`` and in ``/metrics``, and still one after the server restarts."""

from __future__ import annotations

import hashlib
import hmac
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.control.receiver import receiver
from tests.server.conftest import Up
from tests.server.test_acceptance import allot, allot_json

SECRET = "s3cret"

# The only GPU belongs to queue `other`, which lends none of it: a job in `train` waits.
CLUSTER = """
pools: [{{name: local}}]
nodes: [{{name: box, pool: local, capacity: {{gpu: 1, cpu: 8, memory: 16Gi}}}}]
tenants:
  - name: vision
    webhook: {{url: "{url}", secret: {secret}}}
queues:
  - name: all
    children:
      - {{name: train, tenant: vision, max_wait: 1s}}
      - name: other
        tenant: vision
        quota: {{local: {{gpu: 1}}}}
        lending_limit: {{local: {{gpu: 0}}}}
"""


def until(done: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def alerts_metric(up: Up) -> dict[str, float]:
    response = httpx.get(
        f"{up.url}/metrics", headers={"Authorization": f"Bearer {up.config['token']}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "allot_alerts_total" and sample.labels["tenant"] == "vision":
                found[sample.labels["kind"]] = sample.value
            if sample.name == "allot_alert_deliveries" and sample.labels["tenant"] == "vision":
                found[sample.labels["state"]] = sample.value
    return found


def test_a_job_waiting_past_max_wait_fires_one_webhook_call(up: Up) -> None:
    with receiver() as hook:
        cluster = up.root / "cluster.yaml"
        cluster.write_text(CLUSTER.format(url=hook.url, secret=SECRET))
        up.start("-f", str(cluster))
        job_id = allot(up, "run", "--queue", "train", "--gpus", "1", "--", "true").stdout.strip()
        until(lambda: len(hook.calls) >= 1, "the webhook is called")
        time.sleep(2.0)  # a dozen more cycles and checks
        [call] = hook.calls
        body = call.json
        assert (body["kind"], body["job"], body["tenant"], body["queue"]) == (
            "max_wait",
            job_id,
            "vision",
            "train",
        )
        expected = hmac.new(SECRET.encode(), call.body, hashlib.sha256).hexdigest()
        assert call.headers["X-Allotment-Signature"] == f"sha256={expected}"
        assert body["detail"]["max_wait_s"] == 1 and body["detail"]["waited_s"] >= 1

        until(
            lambda: allot_json(up, "alerts")["alerts"][0]["delivery"] == "delivered",
            "the alert is marked delivered",
        )
        [alert] = allot_json(up, "alerts")["alerts"]
        assert (alert["id"], alert["job"], alert["tries"]) == (body["id"], job_id, 1)
        table = allot(up, "alerts").stdout
        assert job_id in table and "delivered" in table
        assert alerts_metric(up) == {"max_wait": 1, "delivered": 1}
        events = allot_json(up, "events", job_id)
        assert [e["kind"] for e in events].count("alert") == 1

        up.stop()
        up.start()
        time.sleep(2.0)
        assert len(hook.calls) == 1
        assert len(allot_json(up, "alerts")["alerts"]) == 1
        assert alerts_metric(up) == {"max_wait": 1, "delivered": 1}
