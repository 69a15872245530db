"""Synthetic gang-heavy workloads: deterministic, at the offered load and gang share
asked for, every job fitting its queue's guarantee, and replayable to the end."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from allotment.domain.errors import InvalidInput
from allotment.domain.loading import load_cluster
from allotment.domain.resources import GPU
from allotment.sim.policies import parse_policy
from allotment.sim.replay import Replay
from allotment.sim.results import SUCCEEDED
from allotment.sim.synthetic import (
    DAY_S,
    MAX_DURATION_S,
    MIN_DURATION_S,
    POOL,
    GangHeavy,
    Workload,
    cluster_data,
    cluster_yaml,
    gang_heavy,
    quotas,
    trace_csv,
)
from allotment.sim.trace import check_trace
from allotment.sim.trace_formats import load_trace

SMALL = GangHeavy(nodes=8, days=0.5, load=0.9, seed=3)
"""Small enough to replay in a test: 64 GPUs, half a day of arrivals."""


@pytest.fixture(scope="module")
def default() -> Workload:
    return gang_heavy(GangHeavy())


def write(workload: Workload, directory: Path) -> tuple[Path, Path]:
    trace = directory / "trace.csv"
    cluster = directory / "cluster.yaml"
    trace.write_text(trace_csv(workload))
    cluster.write_text(cluster_yaml(workload))
    return trace, cluster


def assert_fits(workload: Workload) -> None:
    """Every job fits a node shape, the fleet, and its own queue's nominal quota; times
    are in range and declared limits never cut a job short."""
    spec = workload.spec
    quota = {q.name: q.quota_gpus for q in workload.queues}
    cap = max(MIN_DURATION_S, min(MAX_DURATION_S, math.floor(spec.span_s)))
    for job in workload.jobs:
        assert job.queue in quota
        if job.gang:
            assert job.gpus == spec.gpus_per_node
            assert 2 <= job.replicas <= min(8, spec.nodes)
        else:
            assert job.gpus in {1, 2, 4} and job.gpus <= spec.gpus_per_node
        assert job.gpus * job.replicas <= min(quota[job.queue], spec.fleet_gpus)
        assert 0 <= job.submit_time < spec.span_s
        assert MIN_DURATION_S <= job.duration <= cap
        if job.max_runtime is not None:
            assert job.max_runtime >= job.duration
            assert job.max_runtime % 300 == 0


def test_the_same_seed_gives_the_same_files() -> None:
    first, again = gang_heavy(SMALL), gang_heavy(SMALL)
    assert trace_csv(first) == trace_csv(again)
    assert cluster_yaml(first) == cluster_yaml(again)
    other = gang_heavy(GangHeavy(nodes=8, days=0.5, load=0.9, seed=4))
    assert trace_csv(other) != trace_csv(first)
    assert cluster_data(other) == cluster_data(first)


@pytest.mark.parametrize("load", [0.8, 0.85, 0.9, 0.95])
def test_offered_load_and_gang_share_are_as_asked(load: float) -> None:
    workload = gang_heavy(GangHeavy(load=load))
    assert workload.offered_load == pytest.approx(load, rel=0.03)
    assert workload.realised_gang_share == pytest.approx(0.6, abs=0.03)
    assert_fits(workload)


def test_default_workload_shape(default: Workload) -> None:
    spec = default.spec
    assert [q.name for q in default.queues] == ["team-a", "team-b", "team-c", "team-d"]
    assert [q.quota_gpus for q in default.queues] == [102, 77, 51, 26]
    assert sum(q.quota_gpus for q in default.queues) == spec.fleet_gpus == 256
    gangs = [j for j in default.jobs if j.gang]
    assert {j.replicas for j in gangs} == set(range(2, 9))
    small = [j for j in default.jobs if not j.gang]
    assert sum(j.gpus == 1 for j in small) > 0.6 * len(small)
    assert {j.gpus for j in small} == {1, 2, 4}
    limited = sum(j.max_runtime is not None for j in default.jobs)
    assert 0.45 < limited / len(default.jobs) < 0.55
    assert [j.job_id for j in default.jobs] == [
        f"j{n:06d}" for n in range(1, len(default.jobs) + 1)
    ]
    assert [j.submit_time for j in default.jobs] == sorted(j.submit_time for j in default.jobs)
    assert_fits(default)


def test_queues_peak_at_different_times_of_day(default: Workload) -> None:
    """Queue q's arrivals peak q/Q of a day after queue 0's (the circular mean of the
    time of day), so one queue bursts while the others are quiet."""
    angles: dict[str, list[float]] = defaultdict(list)
    for job in default.jobs:
        angles[job.queue].append(2 * math.pi * (job.submit_time % DAY_S) / DAY_S)
    for index, plan in enumerate(default.queues):
        seen = angles[plan.name]
        mean = math.atan2(sum(map(math.sin, seen)), sum(map(math.cos, seen)))
        peak = (mean / (2 * math.pi)) % 1.0
        expected = index / len(default.queues)
        assert min(abs(peak - expected), 1 - abs(peak - expected)) < 0.05, plan.name


def test_quotas_are_unequal_and_sum_to_the_fleet() -> None:
    assert quotas(256, 4) == [102, 77, 51, 26]
    assert quotas(10, 1) == [10]
    assert quotas(3, 3) == [1, 1, 1]
    assert sum(quotas(64, 7)) == 64


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(-(2**31), 2**31),
    load=st.floats(0.05, 2.0),
    nodes=st.integers(2, 24),
    gpus_per_node=st.sampled_from([1, 2, 4, 8]),
    queues=st.integers(1, 6),
    days=st.floats(0.05, 1.0),
    gang_share=st.floats(0.0, 1.0),
)
def test_any_workload_fits_and_meets_its_budget(
    seed: int,
    load: float,
    nodes: int,
    gpus_per_node: int,
    queues: int,
    days: float,
    gang_share: float,
) -> None:
    """The GPU-time offered misses ``load x fleet x span`` by less than one minute of
    one job per stream (a queue's gangs, its small jobs): the job that would overshoot
    is shortened, and dropped only when that leaves it under a minute."""
    spec = GangHeavy(
        seed=seed,
        load=load,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        queues=queues,
        days=days,
        gang_share=gang_share,
    )
    if queues > nodes * gpus_per_node:
        # Refused up front: every queue is guaranteed at least one GPU.
        with pytest.raises(InvalidInput, match="more than the fleet"):
            gang_heavy(spec)
        return
    try:
        workload = gang_heavy(spec)
    except InvalidInput as exc:
        assert "gang" in exc.message or "no job" in exc.message
        assume(False)
        return
    assert_fits(workload)
    target = load * spec.fleet_gpus * spec.span_s
    biggest = 8 * gpus_per_node
    streams = 2 * queues
    assert workload.gpu_seconds <= target + streams * biggest / 2
    assert workload.gpu_seconds >= target - streams * biggest * MIN_DURATION_S
    if gang_share == 0:
        assert not any(j.gang for j in workload.jobs)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"load": 0.0}, "--load"),
        ({"load": 2.5}, "--load"),
        ({"load": math.nan}, "--load"),
        ({"nodes": 1}, "--nodes"),
        ({"queues": 0}, "--queues"),
        ({"queues": 27}, "--queues"),
        ({"days": 0.0}, "--days"),
        ({"days": -1.0}, "--days"),
        ({"gang_share": 1.5}, "--gang-share"),
        ({"burst": -0.1}, "--burst"),
        ({"limit_share": 2.0}, "--limit-share"),
        ({"gpus_per_node": 0}, "--gpus-per-node"),
        ({"nodes": 4, "queues": 4}, "no queue's quota holds a gang"),
        ({"nodes": 8, "queues": 4, "gang_share": 0.9}, "--gang-share 0.9 is more than"),
        (
            {
                "nodes": 2,
                "gpus_per_node": 1,
                "queues": 2,
                "load": 0.01,
                "days": 0.001,
                "gang_share": 0,
            },
            "no job",
        ),
    ],
)
def test_bad_parameters_are_refused(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        gang_heavy(GangHeavy(**changes))
    assert words in caught.value.message


def test_files_load_and_check(tmp_path: Path) -> None:
    workload = gang_heavy(SMALL)
    trace, cluster_file = write(workload, tmp_path)
    cluster = load_cluster(cluster_file)
    loaded = load_trace(trace, build_cluster=False)
    check_trace(loaded.jobs, cluster, source=str(trace))
    assert len(loaded.jobs) == len(workload.jobs)
    for read, made in zip(loaded.jobs, workload.jobs, strict=True):
        assert (read.job_id, read.queue, read.replicas) == (made.job_id, made.queue, made.replicas)
        assert read.gpus == 1000 * made.gpus
        assert (read.submit_time, read.duration) == (made.submit_time, made.duration)
        assert read.max_runtime == made.max_runtime
    assert sum(n.gpu_count for n in cluster.nodes.values()) == SMALL.fleet_gpus
    assert {q.name: q.nominal[POOL][GPU] for q in cluster.leaves} == {
        q.name: 1000 * q.quota_gpus for q in workload.queues
    }


@pytest.mark.parametrize("policy", ["default", "borrowing", "fifo-isolated"])
def test_a_short_replay_loses_no_job(tmp_path: Path, policy: str) -> None:
    """Every job fits its own queue's guarantee and no declared limit is shorter than
    its job, so every policy runs every job to success."""
    trace, cluster_file = write(gang_heavy(SMALL), tmp_path)
    cluster = load_cluster(cluster_file)
    jobs = load_trace(trace, build_cluster=False).jobs
    result = Replay(cluster, jobs, parse_policy(policy)).run()
    assert len(result.jobs) == len(jobs)
    assert {j.outcome for j in result.jobs} == {SUCCEEDED}
