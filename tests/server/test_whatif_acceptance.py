"""What-if tried as a new user would: ``allot up`` with the local executor runs a few
hundred short jobs in three queues; ``allot whatif`` then replays that recorded history
under the configuration in force (its fidelity, against what really happened) and under
a proposal that raises one queue's guarantee; ``allot history export`` writes a trace
that ``allot sim`` replays."""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from tests.server.conftest import Up
from tests.server.test_acceptance import allot, allot_json

# One node of four GPUs, three queues that may borrow from each other.
CLUSTER = """
pools: [{{name: local}}]
nodes: [{{name: box, pool: local, capacity: {{gpu: 4, cpu: 16, memory: 32Gi}}}}]
tenants: [{{name: vision}}, {{name: nlp}}]
queues:
  - {{name: a, tenant: vision, quota: {{local: {{gpu: 2}}}}}}
  - {{name: b, tenant: nlp, quota: {{local: {{gpu: {b}}}}}}}
  - {{name: c, tenant: nlp, quota: {{local: {{gpu: 1}}}}}}
"""
JOBS = 240


def job(name: str, queue: str, seconds: float, gpus: int = 1) -> str:
    return json.dumps(
        {
            "name": name,
            "queue": queue,
            "replicas": [{"count": 1, "resources": {"gpu": gpus, "cpu": 1}}],
            "command": [sys.executable, "-c", f"import time; time.sleep({seconds:.2f})"],
        }
    )


def run_history(up: Up) -> None:
    """Submit the jobs in three waves, each more than the fleet can run at once, and
    wait until every one has ended."""
    rng = random.Random(7)
    ids: list[str] = []
    with up.client() as client:
        for wave in range(3):
            for i in range(JOBS // 3):
                queue = rng.choices("abc", weights=(2, 2, 1))[0]
                seconds = rng.uniform(0.2, 0.9)
                gpus = 2 if rng.random() < 0.15 else 1
                ids.append(client.submit(job(f"w{wave}-{i}", queue, seconds, gpus))["id"])
            time.sleep(4.0)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            states = [j["state"] for j in client.list_jobs(limit=500)["jobs"]]
            if len(states) >= JOBS and all(s in ("succeeded", "failed") for s in states):
                return
            time.sleep(1.0)
    raise AssertionError("the jobs did not all end in time")


def by_queue(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in data["queues"]}


def test_whatif_replays_recorded_history_faithfully_and_shows_a_proposal(up: Up) -> None:
    (up.root / "cluster.yaml").write_text(CLUSTER.format(b=1))
    up.start("-f", str(up.root / "cluster.yaml"))
    run_history(up)

    # The configuration in force, replayed, against what really happened.
    fidelity = allot_json(up, "whatif", "--since", "1h")
    print("fidelity", json.dumps(fidelity["fidelity"]))
    assert fidelity["jobs"] == JOBS
    queues = by_queue(fidelity)
    assert sorted(queues) == ["a", "b", "c"]
    for name, row in queues.items():
        recorded, replayed = row["recorded"]["wait_avg_s"], row["current"]["wait_avg_s"]
        assert recorded > 1.0, (name, recorded)  # the fleet was contended
        assert row["wait_error"] <= 0.15, (name, recorded, replayed)
    assert fidelity["fidelity"]["wait_error"] <= 0.15
    assert fidelity["fidelity"]["order_agreement"] > 0.9

    # Raise queue b's guarantee: b waits less, its siblings more.
    proposed = up.root / "proposed.yaml"
    proposed.write_text(CLUSTER.format(b=3))
    data = allot_json(up, "whatif", "-f", str(proposed), "--since", "1h")
    rows = by_queue(data)
    current = {q: rows[q]["current"]["wait_avg_s"] for q in rows}
    after = {q: rows[q]["proposed"]["wait_avg_s"] for q in rows}
    recorded = {q: rows[q]["recorded"]["wait_avg_s"] for q in rows}
    print("mean waits recorded", recorded, "in force", current, "proposed", after)
    print("replay_s", data["replay_s"], "turn/stop assumed", data["assumed"])
    assert after["b"] < current["b"] * 0.8, (current, after)
    assert after["a"] > current["a"] and after["c"] > current["c"], (current, after)
    assert any(line.startswith("a: mean wait") for line in data["worse"]), data["worse"]
    assert data["replay_s"] < 30

    # The table names the fidelity next to every queue, and what gets worse; --plot
    # draws the comparison.
    plots = up.root / "plots"
    shown = allot(up, "whatif", "-f", str(proposed), "--since", "1h", "--plot", str(plots))
    assert "fidelity error" in shown.stdout and "worse: a: mean wait" in shown.stdout
    for chart in ("wait_cdf.png", "utilization.png", "queue_waits.png"):
        assert (plots / chart).read_bytes().startswith(b"\x89PNG"), chart

    # apply --dry-run --whatif: the fields that change, and the same comparison.
    dry = allot(up, "apply", "-f", str(proposed), "--dry-run", "--whatif", "--since", "1h")
    assert "spec.quota.local.gpu" in dry.stdout and "worse: a: mean wait" in dry.stdout
    refused = allot(up, "apply", "-f", str(proposed), "--whatif", check=False)
    assert refused.returncode == 1 and "--dry-run" in refused.stderr

    # A tenant admin sees its own tenant's queues only.
    with up.client() as admin:
        token = admin.create_token(user="nlp-admin", tenant="nlp", role="admin")["token"]
    up.env_overrides["ALLOT_TOKEN"] = token
    scoped = allot_json(up, "whatif", "-f", str(proposed), "--since", "1h")
    assert sorted(by_queue(scoped)) == ["b", "c"] and scoped["total"] is None
    assert [t["name"] for t in scoped["tenants"]] == ["nlp"]
    up.env_overrides.pop("ALLOT_TOKEN")

    # The history as a trace, with no job names or commands, replayed by allot sim.
    trace = up.root / "history.csv"
    allot(up, "history", "export", "--since", "1h", "--out", str(trace))
    text = trace.read_text()
    assert text.count("\n") == JOBS + 1 and "w0-" not in text and "sleep" not in text
    sim = allot_json(up, "sim", str(trace), "-f", str(up.root / "cluster.yaml"))
    assert sim[0]["jobs"] == JOBS
    # With pseudonymous users, the replay's start forecasts learn per user.
    named = up.root / "history-users.csv"
    allot(up, "history", "export", "--since", "1h", "--users", "--out", str(named))
    lines = named.read_text().splitlines()
    assert lines[0].endswith(",user") and all(line.split(",")[-1] for line in lines[1:])
    cluster = str(up.root / "cluster.yaml")
    sim = allot_json(up, "sim", str(named), "-f", cluster, "--predict-every", "1")
    assert sim[0]["jobs"] == sim[0]["forecast_samples"] == JOBS
