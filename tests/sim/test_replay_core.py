"""Replays on the real scheduling core (``allotment.scheduler.cycle.schedule_once``)."""

from __future__ import annotations

import csv
import io
from collections import defaultdict

import pytest

from allotment.domain.cluster import Cluster
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.snapshot import Snapshot
from allotment.sim.jobs_out import write_attempts
from allotment.sim.policies import PRESETS, parse_policy
from allotment.sim.replay import Scheduler, replay
from allotment.sim.results import Attempt
from allotment.sim.trace import TraceJob


def core() -> Scheduler:
    return schedule_once


def job(
    job_id: str, submit: float, duration: float, queue: str, gpus: float, replicas: int = 1
) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        submit_time=submit,
        duration=duration,
        queue=queue,
        gpus=int(gpus * 1000),
        replicas=replicas,
    )


# Every job fits its queue's nominal quota (4 GPUs), so every policy can finish them all.
WORKLOAD = [
    job("a1", 0, 100, "team-a", 4),
    job("a2", 0, 50, "team-a", 2),
    job("a3", 5, 30, "team-a", 1, replicas=2),
    job("b1", 10, 80, "team-b", 2, replicas=2),
    job("b2", 12, 20, "team-b", 1),
    job("b3", 12, 20, "team-b", 0.5),
    job("a4", 40, 10, "team-a", 4),
    job("b4", 200, 60, "team-b", 4),
    job("a5", 201, 5, "team-a", 1),
]


def jobs_out(attempts: list[Attempt]) -> list[dict[str, str]]:
    out = io.StringIO()
    write_attempts(attempts, out)
    return list(csv.DictReader(io.StringIO(out.getvalue())))


def assert_no_node_over_committed(rows: list[dict[str, str]], capacity: dict[str, float]) -> None:
    events: list[tuple[float, int, str, float]] = []
    for row in rows:
        if not row["start_s"]:
            continue
        for pair in row["nodes"].split(";"):
            node, gpus = pair.split(":")
            events.append((float(row["start_s"]), 1, node, float(gpus)))
            events.append((float(row["end_s"]), 0, node, -float(gpus)))
    used: dict[str, float] = defaultdict(float)
    for at, _, node, delta in sorted(events):  # ends before starts at the same instant
        used[node] += delta
        assert used[node] <= capacity[node] + 1e-9, f"{node} over-committed at t={at}"


@pytest.mark.parametrize("policy", [*PRESETS, "borrowing+backfill", "default+oracle"])
def test_every_job_finishes_and_no_node_is_over_committed(
    tiny_cluster: Cluster, policy: str
) -> None:
    result = replay(tiny_cluster, WORKLOAD, parse_policy(policy), scheduler=core())
    assert {j.job_id: j.outcome for j in result.jobs} == {j.job_id: "succeeded" for j in WORKLOAD}
    rows = jobs_out(result.attempts)
    capacity = {name: node.capacity["gpu"] / 1000 for name, node in tiny_cluster.nodes.items()}
    assert_no_node_over_committed(rows, capacity)
    for row in rows:
        assert float(row["start_s"]) >= float(row["submit_s"])
        assert sum(float(p.split(":")[1]) for p in row["nodes"].split(";")) == float(row["gpus"])
    finals = [r for r in rows if r["outcome"] == "succeeded"]
    assert sorted(r["job_id"] for r in finals) == sorted(j.job_id for j in WORKLOAD)
    durations = {j.job_id: j.duration for j in WORKLOAD}
    for row in finals:
        assert float(row["end_s"]) - float(row["start_s"]) == durations[row["job_id"]]


@pytest.mark.parametrize("policy", ["fifo-isolated", "default"])
def test_the_core_never_sees_true_durations(tiny_cluster: Cluster, policy: str) -> None:
    schedule_once = core()
    snapshots = 0

    def spy(snapshot: Snapshot) -> Decisions:
        nonlocal snapshots
        snapshots += 1
        assert all(p.expected_runtime is None for p in snapshot.pending)
        assert all(r.expected_end is None for r in snapshot.running)
        return schedule_once(snapshot)

    replay(tiny_cluster, WORKLOAD, parse_policy(policy), scheduler=spy)
    assert snapshots > 0


def test_isolated_queues_do_not_borrow(tiny_cluster: Cluster) -> None:
    """Two 4-GPU team-a jobs at once: isolated, the second waits for the first."""
    work = [job("a1", 0, 100, "team-a", 4), job("a2", 0, 100, "team-a", 4)]
    isolated = replay(tiny_cluster, work, parse_policy("fifo-isolated"), scheduler=core())
    assert sorted(j.first_start for j in isolated.jobs) == [0, 100]
    borrowing = replay(tiny_cluster, work, parse_policy("borrowing"), scheduler=core())
    assert sorted(j.first_start for j in borrowing.jobs) == [0, 0]


def test_reclaim_preempts_the_borrower(tiny_cluster: Cluster) -> None:
    """team-b borrows team-a's idle node; team-a's job takes it back at once."""
    work = [
        job("b1", 0, 1000, "team-b", 4),
        job("b2", 0, 1000, "team-b", 4),
        job("a1", 100, 50, "team-a", 4),
    ]
    result = replay(tiny_cluster, work, parse_policy("borrowing"), scheduler=core())
    by_id = {j.job_id: j for j in result.jobs}
    assert result.preemptions == 1
    assert by_id["a1"].first_start == 100
    assert all(j.outcome == "succeeded" for j in result.jobs)
    rows = jobs_out(result.attempts)
    assert [r["outcome"] for r in rows].count("preempted") == 1
    capacity = {name: node.capacity["gpu"] / 1000 for name, node in tiny_cluster.nodes.items()}
    assert_no_node_over_committed(rows, capacity)
