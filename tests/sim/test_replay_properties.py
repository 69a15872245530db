"""Properties every replay must have, on random traces and small random clusters.

For each of the five presets, on up to 30 jobs (whole and fractional GPUs, gangs, random
submit times and durations, some ``max_runtime``) over 1-2 pools and 1-3 queues, from the
attempts (the rows ``--jobs-out`` writes):

1. at no instant does a node hold more GPUs than it has (fractions included);
2. no attempt starts before its job's submit time x time scale;
3. a job that ``succeeded`` ran exactly its duration in its last attempt, a ``failed``
   one exactly its ``max_runtime``; earlier attempts were preempted; attempts of one job
   never overlap;
4. no job is lost, and a job is ``unfinished`` exactly when it can never run: the
   replay ends with nothing running, so anything that fits the empty cluster has run;
5. every attempt of a gang holds all its replicas' GPUs, whole replicas per node, in
   one pool;
6. without borrowing, a queue never holds more than its nominal quota in a pool.


Jobs that can never run remain in the traces: a replica larger than every node, a job
over its queue's quota without borrowing, a queue with no quota in a pool without
borrowing.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.sim.jobs_out import COLUMNS, write_jobs_out
from allotment.sim.metrics import summarize
from allotment.sim.policies import PRESETS, parse_policy
from allotment.sim.replay import replay
from allotment.sim.results import FAILED, PREEMPTED, SUCCEEDED, UNFINISHED, Attempt, ReplayResult
from allotment.sim.trace import TraceJob

MILLI = 1000
ISOLATED = ["fifo-isolated", "backfill"]
BORROWING = ["borrowing", "fair-share", "default"]


def examples(n: int) -> settings:
    """Hypothesis settings for ``n`` examples. The borrowing presets get fewer: their
    replays are slower (each reclaim can ping-pong for 64 cycles at one instant; see
    ``test_a_reclaiming_job_starts_right_after_its_one_preemption``)."""
    return settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@dataclass(frozen=True)
class World:
    cluster: Cluster
    jobs: list[TraceJob]
    time_scale: float
    capacity: dict[str, int]
    """Milli-GPUs of each healthy node."""
    pool_of: dict[str, str]
    """Each healthy node's pool."""
    nominal: dict[tuple[str, str], int]
    """(queue, pool) -> milli-GPUs, for the pools the queue names a quota in."""

    def nodes_in(self, pool: str) -> list[int]:
        return [cap for node, cap in self.capacity.items() if self.pool_of[node] == pool]

    def pools_for(self, job: TraceJob) -> list[str]:
        return [job.pool] if job.pool else sorted(set(self.pool_of.values()))

    def slots(self, job: TraceJob, pool: str) -> int:
        """How many of ``job``'s replicas the empty ``pool`` holds at once."""
        if job.gpus >= MILLI:
            return sum(cap // job.gpus for cap in self.nodes_in(pool))
        # Fractions: each replica takes a share of one device.
        return sum((cap // MILLI) * (MILLI // job.gpus) for cap in self.nodes_in(pool))

    def can_ever_run(self, job: TraceJob, *, borrowing: bool) -> bool:
        """Whether ``job`` fits the empty cluster: some pool open to it has nodes that
        take all its replicas at once, within what its queue may use there."""
        for pool in self.pools_for(job):
            if self.slots(job, pool) < job.replicas:
                continue
            if borrowing:
                return True
            nominal = self.nominal.get((job.queue, pool))
            if nominal is not None and job.total_gpus <= nominal:
                return True
        return False


SIZES = st.one_of(
    # (milli-GPUs per replica, replicas): single whole GPUs, gangs of a node-size divisor,
    # fractions (alone or as gangs).
    st.tuples(st.sampled_from([1, 2, 3, 4, 8]).map(lambda g: g * MILLI), st.just(1)),
    st.tuples(st.sampled_from([1, 2, 4, 8]).map(lambda g: g * MILLI), st.integers(2, 3)),
    st.tuples(st.sampled_from([250, 500]), st.integers(1, 3)),
)
TIMES = st.integers(0, 400).map(lambda t: t / 4)
DURATIONS = st.integers(0, 120).map(lambda t: t / 2)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    pools: list[str] = []
    nodes: list[dict[str, object]] = []
    healthy_gpus: dict[str, int] = {}
    for p in range(draw(st.integers(1, 2))):
        pool = f"p{p}"
        pools.append(pool)
        size = draw(st.sampled_from([4, 8]))
        count = draw(st.integers(1, 3))
        nodes.append(
            {"name_prefix": f"{pool}-n", "count": count, "pool": pool, "capacity": {"gpu": size}}
        )
        if draw(st.integers(0, 4)) == 0:
            nodes.append(
                {"name": f"{pool}-down", "pool": pool, "capacity": {"gpu": size}, "healthy": False}
            )
        healthy_gpus[pool] = size * count
    leaves: list[dict[str, object]] = []
    nominal: dict[tuple[str, str], int] = {}
    for q in range(draw(st.integers(1, 3))):
        name = f"q{q}"
        quota: dict[str, dict[str, float]] = {}
        for pool in pools:
            if draw(st.integers(0, 3)) == 0:
                continue  # no quota named in this pool
            halves = draw(st.integers(0, 2 * healthy_gpus[pool]))
            quota[pool] = {"gpu": halves / 2}
            nominal[(name, pool)] = halves * MILLI // 2
        leaves.append({"name": name, "quota": quota})
    queues = [{"name": "org", "children": leaves}] if draw(st.booleans()) else leaves
    text = yaml.safe_dump({"pools": [{"name": p} for p in pools], "nodes": nodes, "queues": queues})
    cluster = load_cluster_text(text, source="generated")

    jobs: list[TraceJob] = []
    for i in range(draw(st.integers(1, 30))):
        gpus, replicas = draw(SIZES)
        max_runtime = draw(st.one_of(st.none(), st.none(), st.integers(1, 120).map(float)))
        jobs.append(
            TraceJob(
                job_id=f"j{i}",
                submit_time=draw(TIMES),
                duration=draw(DURATIONS),
                queue=draw(st.sampled_from([str(leaf["name"]) for leaf in leaves])),
                gpus=gpus,
                replicas=replicas,
                pool=draw(st.one_of(st.none(), st.none(), st.none(), st.sampled_from(pools))),
                max_runtime=max_runtime,
            )
        )
    capacity = {name: node.capacity["gpu"] for name, node in cluster.nodes.items() if node.healthy}
    pool_of = {name: cluster.nodes[name].pool for name in capacity}
    time_scale = draw(st.sampled_from([1.0, 1.0, 0.5, 2.0, 0.1, 0.0]))
    world = World(cluster, jobs, time_scale, capacity, pool_of, nominal)
    return world


def run(world: World, policy: str) -> ReplayResult:
    return replay(world.cluster, world.jobs, parse_policy(policy), time_scale=world.time_scale)


def peak_usage(intervals: Iterable[tuple[float, float, object, int]]) -> dict[object, int]:
    """The largest sum of amounts per key at any instant over [start, end) intervals."""
    events: list[tuple[float, int, int, object]] = []
    for start, end, key, amount in intervals:
        if end > start:
            events.append((start, 1, amount, key))
            events.append((end, 0, -amount, key))
    used: dict[object, int] = defaultdict(int)
    peak: dict[object, int] = defaultdict(int)
    # At one instant ends come before starts: a node freed at t may be reused at t.
    for _, _, delta, key in sorted(events, key=lambda e: (e[0], e[1])):
        used[key] += delta
        peak[key] = max(peak[key], used[key])
    return peak


def started(attempts: Iterable[Attempt]) -> list[Attempt]:
    return [a for a in attempts if a.start is not None]


def check_nodes_never_over_committed(world: World, attempts: list[Attempt]) -> None:
    for a in started(attempts):
        assert a.end is not None, f"{a.job_id} still running after the replay"
        for node, _ in a.nodes:
            assert node in world.capacity, f"{a.job_id} placed on {node}, not a healthy node"
    peak = peak_usage(
        (a.start, a.end, node, gpus)
        for a in started(attempts)
        for node, gpus in a.nodes
        if a.start is not None and a.end is not None
    )
    for node, most in peak.items():
        assert most <= world.capacity[str(node)], f"{node}: {most} of {world.capacity[node]}"


def check_attempts(world: World, result: ReplayResult, policy: str) -> None:
    traces = {j.job_id: j for j in world.jobs}
    by_job: dict[str, list[Attempt]] = defaultdict(list)
    for a in result.attempts:
        by_job[a.job_id].append(a)
    flags = parse_policy(policy)
    borrowing = flags.borrowing
    # 4. No job is lost; unfinished exactly when it can never run.
    assert [j.job_id for j in result.jobs] == [j.job_id for j in world.jobs]
    assert set(by_job) == set(traces)
    for job in result.jobs:
        trace = traces[job.job_id]
        attempts = sorted(by_job[job.job_id], key=lambda a: a.attempt)
        assert [a.attempt for a in attempts] == list(range(1, len(attempts) + 1))
        assert job.outcome in (SUCCEEDED, FAILED, UNFINISHED)
        assert job.outcome == attempts[-1].outcome
        runnable = world.can_ever_run(trace, borrowing=borrowing)
        assert (job.outcome != UNFINISHED) == runnable, (
            f"{job.job_id} ({trace.replicas} x {trace.gpus}m in {trace.queue}, pool "
            f"{trace.pool}) is {job.outcome}; it {'can' if runnable else 'can never'} run"
        )
        if job.outcome == UNFINISHED:
            (only,) = attempts
            assert (only.start, only.end, only.nodes) == (None, None, ())
            assert job.attempts == 0 and job.first_start is None and job.end is None
            continue

        # 2. Nothing starts before its (scaled) submit time.
        submit = trace.submit_time * world.time_scale
        assert job.submit == submit
        for a in attempts:
            assert a.submit == submit
            assert a.start is not None and a.end is not None
            assert a.start >= submit, f"{a.job_id} starts at {a.start}, submitted {submit}"

        # 3. Runtimes and outcomes; attempts one after another.
        runtime = trace.duration
        if trace.max_runtime is not None:
            runtime = min(runtime, trace.max_runtime)
        *earlier, last = attempts
        assert all(a.outcome == PREEMPTED for a in earlier)
        for a in earlier:
            assert a.start is not None and a.end is not None
            assert a.end < a.start + runtime, f"{a.job_id} preempted after its end"
        for before, after in pairwise(attempts):
            assert before.end is not None and after.start is not None
            assert after.start >= before.end, f"{job.job_id}: attempts overlap"
        assert last.start is not None and last.end is not None
        if trace.max_runtime is not None and trace.duration > trace.max_runtime:
            assert last.outcome == FAILED
            assert math.isclose(last.end - last.start, trace.max_runtime, abs_tol=1e-9)
        else:
            assert last.outcome == SUCCEEDED
            assert math.isclose(last.end - last.start, trace.duration, abs_tol=1e-9)
        assert (job.first_start, job.end) == (attempts[0].start, last.end)
        assert (job.attempts, job.preempted) == (len(attempts), len(earlier))
        held = sum(
            a.gpus * (a.end - a.start)
            for a in attempts
            if a.end is not None and a.start is not None
        )
        assert math.isclose(job.gpu_seconds, held, rel_tol=1e-9, abs_tol=1e-6)

        # 5. Gangs: every attempt holds every replica, whole replicas per node, one pool.
        for a in attempts:
            assert a.gpus == trace.total_gpus
            assert sum(g for _, g in a.nodes) == trace.total_gpus
            assert all(g % trace.gpus == 0 for _, g in a.nodes), a.nodes
            pools = {world.pool_of[node] for node, _ in a.nodes}
            assert len(pools) == 1, f"{a.job_id} spans pools {pools}"
            if trace.pool is not None:
                assert pools == {trace.pool}


def check_quota_never_exceeded(world: World, attempts: list[Attempt]) -> None:
    peak = peak_usage(
        (a.start, a.end, (a.queue, world.pool_of[node]), gpus)
        for a in started(attempts)
        for node, gpus in a.nodes
        if a.start is not None and a.end is not None
    )
    for key, most in peak.items():
        assert isinstance(key, tuple)
        assert most <= world.nominal.get(key, 0), f"{key}: {most} held, nominal {key}"


def check_replay(world: World, policy: str) -> None:
    result = run(world, policy)
    check_nodes_never_over_committed(world, result.attempts)
    check_attempts(world, result, policy)
    flags = parse_policy(policy)
    if not flags.borrowing:
        check_quota_never_exceeded(world, result.attempts)
    summary = summarize(result)
    assert summary["jobs"] == len(world.jobs)
    assert summary["finished"] + summary["unfinished"] == len(world.jobs)
    assert summary["preemptions"] == sum(a.outcome == PREEMPTED for a in result.attempts)
    if not (flags.preemption or flags.reclaim):
        assert summary["preemptions"] == 0


def test_the_presets_are_covered() -> None:
    assert sorted(ISOLATED + BORROWING) == sorted(PRESETS)


@pytest.mark.parametrize("policy", ISOLATED)
@examples(40)
@given(world=worlds())
def test_replay_invariants_isolated(policy: str, world: World) -> None:
    check_replay(world, policy)


@pytest.mark.parametrize("policy", BORROWING)
@examples(15)
@given(world=worlds())
def test_replay_invariants_borrowing(policy: str, world: World) -> None:
    check_replay(world, policy)


def read_jobs_out(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        return list(reader)


def milli(text: str) -> int:
    return round(float(text) * MILLI)


@pytest.mark.parametrize("policy", ["fifo-isolated", "default"])
@examples(15)
@given(world=worlds())
def test_jobs_out_file_has_the_same_properties(
    policy: str, world: World, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same checks on the ``--jobs-out`` file itself, read back with the csv module
    (times there are rounded to 3 decimals)."""
    result = run(world, policy)
    path = tmp_path_factory.mktemp("jobs-out", numbered=True) / "jobs.csv"
    assert write_jobs_out(result.attempts, path) == len(result.attempts)
    rows = read_jobs_out(path)
    assert len(rows) == len(result.attempts)
    traces = {j.job_id: j for j in world.jobs}
    assert {r["job_id"] for r in rows} == set(traces)

    intervals = []
    for row in rows:
        trace = traces[row["job_id"]]
        assert row["queue"] == trace.queue
        assert math.isclose(float(row["submit_s"]), trace.submit_time * world.time_scale)
        assert milli(row["gpus"]) == trace.total_gpus
        if row["outcome"] == UNFINISHED:
            assert (row["start_s"], row["end_s"], row["nodes"]) == ("", "", "")
            continue
        start, end = float(row["start_s"]), float(row["end_s"])
        assert start >= float(row["submit_s"])
        assert end >= start
        pairs = [pair.rsplit(":", 1) for pair in row["nodes"].split(";")]
        assert sum(milli(g) for _, g in pairs) == trace.total_gpus
        intervals += [(start, end, node, milli(g)) for node, g in pairs]
        if row["outcome"] == SUCCEEDED:
            assert math.isclose(end - start, trace.duration, abs_tol=2e-3)
        elif row["outcome"] == FAILED:
            assert trace.max_runtime is not None
            assert math.isclose(end - start, trace.max_runtime, abs_tol=2e-3)
        else:
            assert row["outcome"] == PREEMPTED
    for node, most in peak_usage(intervals).items():
        assert most <= world.capacity[str(node)], f"{node} over-committed in the file"
    finals = [r for r in rows if r["outcome"] != PREEMPTED]
    assert sorted(r["job_id"] for r in finals) == sorted(traces)
