"""How fast ``allot whatif`` answers for a large recorded history.

Not a test. Builds a store (SQLite in a temporary directory, or ``--db`` for a
PostgreSQL URL) holding ``--jobs`` recorded jobs over ``--days`` days, as the live system
writes them (jobs, attempts and their state-move events). The history itself comes from
a replay of a synthetic workload on the real scheduler: ``--queues`` queues sharing
``--nodes`` nodes of 8 GPUs at about ``--load`` offered load, jobs of 1 to 8 GPUs (a
fifth of them gangs of 2 to 4 nodes), log-normal run times. Then it times what the
server does for one ``GET``/``POST /whatif``, phase by phase:

* ``read``: the three queries of :func:`allotment.store.history.recorded_jobs`;
* ``compare``: both replays (in force and proposed: one queue's quota doubled) and the
  figures, :func:`allotment.sim.whatif.compare`.

Prints one line per phase and a JSON summary. Run ``python bench/bench_whatif.py --help``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from allotment.domain.loading import load_cluster_text
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.sim.replay import Replay
from allotment.sim.trace import TraceJob
from allotment.sim.whatif import compare, workers_for
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.history import recorded_jobs
from allotment.store.models import Attempt, Event, Job

T0 = 1_800_000_000.0


def cluster_text(nodes: int, queues: int, *, double: int | None = None) -> str:
    share = nodes * 8 // queues
    lines = [
        "pools: [{name: a100, price_per_gpu_hour: 2}]",
        f"nodes: [{{name_prefix: n, count: {nodes}, pool: a100, capacity: {{gpu: 8}}}}]",
        "queues:",
        "  - name: org",
        "    children:",
    ]
    for q in range(queues):
        gpus = share * 2 if q == double else share
        lines.append(f"      - {{name: q{q}, quota: {{a100: {{gpu: {gpus}}}}}}}")
    return "\n".join(lines) + "\n"


def workload(jobs: int, days: float, nodes: int, queues: int, load: float) -> list[TraceJob]:
    rng = random.Random(1)
    span = days * 86400
    shapes = []
    for _ in range(jobs):
        if rng.random() < 0.2:
            shapes.append((8000, rng.choice((2, 3, 4))))
        else:
            shapes.append((rng.choice((1, 1, 1, 2, 4, 8)) * 1000, 1))
    gpu_seconds = load * nodes * 8 * span
    mean_gpus = sum(g * r for g, r in shapes) / len(shapes) / 1000
    mean_run = gpu_seconds / jobs / mean_gpus
    sigma = 1.0
    mu = math.log(mean_run) - sigma**2 / 2
    return [
        TraceJob(
            job_id=f"j{i:07d}",
            submit_time=T0 + rng.uniform(0, span),
            duration=min(rng.lognormvariate(mu, sigma), span / 4),
            queue=f"q{rng.randrange(queues)}",
            gpus=gpus,
            replicas=replicas,
        )
        for i, (gpus, replicas) in enumerate(shapes)
    ]


def fill(url: str, args: argparse.Namespace) -> float:
    """Record a replayed history in the store at ``url``; return the window's end."""
    cluster = load_cluster_text(cluster_text(args.nodes, args.queues))
    jobs = workload(args.jobs, args.days, args.nodes, args.queues, args.load)
    until = T0 + args.days * 86400
    started = time.perf_counter()
    result = Replay(cluster, jobs, SchedulerPolicy(), until=until).run()
    print(f"history: {len(jobs):,} jobs replayed in {time.perf_counter() - started:.1f} s")
    engine = make_engine(url)
    migrate.upgrade(engine)
    by_id = {j.job_id: j for j in jobs}
    job_rows: list[dict[str, Any]] = []
    attempt_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    numbers: dict[str, int] = {}
    for story in result.jobs:
        trace = by_id[story.job_id]
        state = {"succeeded": "succeeded", "failed": "failed"}.get(story.outcome, "pending")
        if story.outcome == "unfinished" and story.first_start is not None:
            state = "running"
        spec = {
            "name": story.job_id,
            "queue": trace.queue,
            "replicas": [
                {
                    "name": "worker",
                    "count": trace.replicas,
                    "resources": {"gpu": str(trace.gpus // 1000)},
                }
            ],
        }
        job_rows.append(
            {
                "id": story.job_id,
                "name": story.job_id,
                "tenant": "default",
                "queue": trace.queue,
                "user": "u",
                "type": "training",
                "priority_class": "normal",
                "spec": spec,
                "state": state,
                "attempt": 0,
                "submit_time": story.submit,
                "created_at": story.submit,
                "updated_at": story.end or until,
            }
        )
        event_rows.append(
            {
                "job_id": story.job_id,
                "at": story.submit,
                "kind": "transition",
                "to_state": "pending",
            }
        )
    for attempt in sorted(result.attempts, key=lambda a: a.start or math.inf):
        if attempt.start is None:
            continue
        number = numbers[attempt.job_id] = numbers.get(attempt.job_id, 0) + 1
        attempt_rows.append(
            {
                "job_id": attempt.job_id,
                "number": number,
                "state": attempt.outcome,
                "start_time": attempt.start,
                "end_time": attempt.end,
                "pool": "a100",
                "allocation": [],
                "borrowed": {"gpu": attempt.borrowed},
            }
        )
        event_rows.append(
            {
                "job_id": attempt.job_id,
                "at": attempt.start,
                "kind": "transition",
                "to_state": "admitted",
            }
        )
        if attempt.end is not None:
            event_rows.append(
                {
                    "job_id": attempt.job_id,
                    "at": attempt.end,
                    "kind": "transition",
                    "to_state": attempt.outcome,
                }
            )
            if attempt.outcome == "preempted":
                event_rows.append(
                    {
                        "job_id": attempt.job_id,
                        "at": attempt.end,
                        "kind": "transition",
                        "to_state": "pending",
                    }
                )
    event_rows.sort(key=lambda e: e["at"])
    for row in event_rows:
        row.update(from_state=None, message="", detail={})
    started = time.perf_counter()
    with engine.begin() as connection:
        for table, rows in ((Job, job_rows), (Attempt, attempt_rows), (Event, event_rows)):
            for i in range(0, len(rows), 5000):
                connection.execute(insert(table), rows[i : i + 5000])
    print(
        f"store: {len(job_rows):,} jobs, {len(attempt_rows):,} attempts, "
        f"{len(event_rows):,} events written in {time.perf_counter() - started:.1f} s"
    )
    engine.dispose()
    return until


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--db", help="A PostgreSQL URL (default: SQLite in a temporary dir).")
    parser.add_argument(
        "--workers", type=int, help="Processes for the two replays (default: as the server)."
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'allotment.db'}"
        until = fill(url, args)
        since = until - args.days * 86400
        engine = make_engine(url)
        sessions = session_factory(engine)
        started = time.perf_counter()
        with sessions() as session:
            recorded = recorded_jobs(session, since=since, until=until)
        read_s = time.perf_counter() - started
        print(f"read: {len(recorded):,} recorded jobs in {read_s:.2f} s")
        workers = args.workers or workers_for(len(recorded))
        in_force = load_cluster_text(cluster_text(args.nodes, args.queues))
        proposed = load_cluster_text(cluster_text(args.nodes, args.queues, double=0))
        started = time.perf_counter()
        out = compare(
            recorded,
            since=since,
            until=until,
            in_force=[(0.0, in_force)],
            proposed=proposed,
            policy=SchedulerPolicy(),
            workers=workers,
        )
        compare_s = time.perf_counter() - started
        print(f"compare: two replays and the figures in {compare_s:.2f} s")
        engine.dispose()
    q0 = next(q for q in out["queues"] if q["name"] == "q0")
    summary = {
        "jobs": args.jobs,
        "days": args.days,
        "read_s": round(read_s, 2),
        "compare_s": round(compare_s, 2),
        "total_s": round(read_s + compare_s, 2),
        "workers": workers,
        "fidelity_wait_error": out["fidelity"]["wait_error"],
        "worst_queue_error": out["fidelity"]["worst_queue_error"],
        "q0_wait_avg_s": [q0[k]["wait_avg_s"] for k in ("recorded", "current", "proposed")],
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
