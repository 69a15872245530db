"""Issue 7's accounting acceptance, tried as a new user would: real jobs through a real
``allot up``, utilisation samples in ``job_usage`` (as the sampler writes them), and
``allot report`` as a process. The report for the last day shows allocated vs used
GPU-hours and cost per tenant that add up exactly to the per-job records, and to the
hand-computed allocation x price."""

from __future__ import annotations

import csv
import io
import json
import time
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from allotment.store.db import make_engine, session_factory
from allotment.store.models import Attempt, JobUsage
from tests.server.conftest import Up
from tests.server.test_acceptance import allot, wait_for

PRICE = 2.5
CLUSTER = f"""
pools: [{{name: local, price_per_gpu_hour: {PRICE}}}]
nodes: [{{name: box, pool: local, capacity: {{gpu: 4, cpu: 8, memory: 16Gi}}}}]
tenants: [{{name: vision}}, {{name: nlp}}]
queues:
  - name: root
    children:
      - {{name: vision-q, tenant: vision, quota: {{local: {{gpu: 2}}}}}}
      - {{name: nlp-q, tenant: nlp, quota: {{local: {{gpu: 2}}}}}}
"""
FIGURES = ("allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "unmeasured_gpu_hours")


def exact(value: Any) -> Decimal:
    return Decimal(repr(value))


def run(up: Up, queue: str, gpus: int, seconds: float) -> str:
    code = f"import time; time.sleep({seconds})"
    done = allot(up, "run", "--queue", queue, "--gpus", str(gpus), "--", "python3", "-c", code)
    return done.stdout.strip()


def test_the_last_day_per_tenant_adds_up_to_the_jobs(up: Up) -> None:
    cluster = up.root / "cluster.yaml"
    cluster.write_text(CLUSTER)
    up.start("-f", str(cluster))
    finished = [run(up, "vision-q", 1, 1), run(up, "vision-q", 2, 1.5), run(up, "nlp-q", 1, 1)]
    running = run(up, "nlp-q", 1, 120)
    for job_id in finished:
        wait_for(up, job_id, {"succeeded"})
    wait_for(up, running, {"running"})

    # The sampler's rows: finished jobs busy at 40% all along; the running one measured
    # for (at most) its first half second only, at 100%.
    engine = make_engine(f"sqlite:///{up.data_dir / 'allotment.db'}")
    sessions = session_factory(engine)
    sampled = 0.0
    with sessions.begin() as db:
        for attempt in db.scalars(select(Attempt)):
            assert attempt.start_time is not None
            end = attempt.end_time
            if end is None:
                sampled = min(0.5, time.time() - attempt.start_time)
            db.add(
                JobUsage(
                    job_id=attempt.job_id,
                    attempt=attempt.number,
                    interval_start=attempt.start_time,
                    interval_s=(end - attempt.start_time) if end is not None else sampled,
                    samples=5,
                    gpus=1,
                    gpu_util_avg=40.0 if end is not None else 100.0,
                )
            )

    report = json.loads(allot(up, "report", "--since", "1d", "--jobs", "-o", "json").stdout)
    until = report["until"]
    records = report["records"]
    assert {r["job"] for r in records} == {*finished, running}

    # Hand-computed from the store: GPUs x held hours (up to the report's end) x price.
    with sessions() as db:
        held = {  # per attempt: a borrower may be preempted and run again
            (a.job_id, a.number): (
                sum(p["resources"]["gpu"] for p in a.allocation) / 1000,
                (a.end_time if a.end_time is not None else until) - a.start_time,
            )
            for a in db.scalars(select(Attempt))
            if a.start_time is not None
        }
    engine.dispose()
    by_tenant = {row["key"]: row for row in report["rows"]}
    assert set(by_tenant) == {"vision", "nlp"}
    for tenant, row in by_tenant.items():
        mine = [r for r in records if r["tenant"] == tenant]
        for figure in (*FIGURES, "cost", "cpu_hours", "memory_gib_hours"):
            assert sum(exact(r[figure]) for r in mine) == exact(row[figure]), (tenant, figure)
        hand_allocated = sum(
            held[r["job"], r["attempt"]][0] * held[r["job"], r["attempt"]][1] / 3600 for r in mine
        )
        assert abs(row["allocated_gpu_hours"] - hand_allocated) <= 1e-6 * len(mine)
        assert abs(row["cost"] - hand_allocated * PRICE) <= 2e-6 * len(mine)
        assert row["allocated_gpu_hours"] > row["used_gpu_hours"] > 0
    for r in records:
        assert r["gpus"] == held[r["job"], r["attempt"]][0]
        if r["job"] in finished:  # measured all along at 40%
            assert abs(r["used_gpu_hours"] - 0.4 * r["allocated_gpu_hours"]) <= 1e-6
            assert r["unmeasured_gpu_hours"] == 0 and not r["open"]
        else:  # open: counted up to the report's end; measured briefly, at 100%
            assert r["open"] and r["held_until"] == until
            assert sampled > 0 and abs(r["used_gpu_hours"] - sampled / 3600) <= 1e-6
    vision = by_tenant["vision"]
    # used / measured of figures rounded to 10^-6 GPU-hours, over a few seconds of use
    assert vision["jobs"] == 2 and abs(vision["utilization"] - 0.4) < 0.01
    total = report["total"]
    for figure in (*FIGURES, "cost"):
        assert sum(exact(row[figure]) for row in report["rows"]) == exact(total[figure])
    # One wait per attempt: 4 jobs, and a second attempt for a vision borrower when nlp
    # reclaimed its guarantee (whether that happens depends on how fast they ran).
    assert report["waits_total"]["count"] == len(held) >= 4

    # The same report as CSV and as HTML, from the command line.
    table = list(csv.reader(io.StringIO(allot(up, "report", "--format", "csv").stdout)))
    cost = table[0].index("cost")
    assert {r[0]: Decimal(r[cost]) for r in table[1:]}["vision"] == exact(vision["cost"])
    page = up.root / "report.html"
    allot(up, "report", "--since", "1d", "--format", "html", "--out", str(page))
    assert page.read_text().count("data:image/png;base64,") == 4
    allot(up, "cancel", running)
