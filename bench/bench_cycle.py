"""Scheduling-cycle benchmark: synthetic clusters at three scales, timed with perf_counter.

Not a test. For each scale it builds a cluster (pools of 8-GPU nodes in racks, a queue
tree of departments and leaf queues with nominal quotas), fills about half the GPUs with
valid running jobs (admitted by ``schedule_once`` itself, then aged), adds the pending
backlog, and measures:

(a) one cycle: ``schedule_once`` N times on the same snapshot (p50, p99, max);
(b) sustained: cycles that move admissions to running, finish a share of running jobs,
    retire preemption victims and top the backlog up; admissions per second of
    scheduler time. With ``--session`` the same world drives an incremental
    ``Session`` (told what changed) instead of a fresh snapshot each cycle.

Run ``python bench/bench_cycle.py --help``; see bench/README.md.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import pstats
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from allotment.domain.cluster import Cluster, ClusterFile
from allotment.domain.loading import validate_model
from allotment.domain.resources import GPU, MILLI
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import (
    PendingJob,
    ReplicaRequest,
    RunningJob,
    SchedulerPolicy,
    Snapshot,
)

NOW = 1_767_600_000.0  # a Monday, 08:00 UTC (2026-01-05), as in the tests
GI = 2**30 * MILLI  # one GiB in milli-units

# ----------------------------------------------------------------------------- scales


@dataclass(frozen=True)
class Scale:
    name: str
    nodes: int
    pending: int
    queues: int  # leaf queues
    departments: int
    pools: tuple[tuple[str, float], ...]  # (pool, share of nodes)


SCALES: dict[str, Scale] = {
    "small": Scale("small", 100, 1_000, 20, 3, (("h100", 0.5), ("a100", 0.3), ("l40s", 0.2))),
    "medium": Scale(
        "medium",
        1_000,
        20_000,
        200,
        6,
        (("h100", 0.4), ("a100", 0.3), ("h200", 0.2), ("l40s", 0.1)),
    ),
    "large": Scale(
        "large",
        4_000,
        100_000,
        500,
        10,
        (("h100", 0.4), ("a100", 0.3), ("h200", 0.2), ("l40s", 0.1)),
    ),
}

GPUS_PER_NODE = 8
NODE_CPU = 128
NODE_MEMORY_GI = 1280
CPU_PER_GPU = 12
MEM_GI_PER_GPU = 128

# Priority mix (default classes): name -> weight.
CLASS_MIX = (
    ("production", 0.04),
    ("key-project", 0.08),
    ("training", 0.58),
    ("experiment", 0.20),
    ("scavenger", 0.10),
)
# Shapes: (kind, weight). gang = 2-8 replicas x 8 GPUs.
SHAPE_MIX = (
    ("cpu", 0.10),
    ("g1", 0.32),
    ("g2", 0.14),
    ("g4", 0.14),
    ("g8", 0.25),
    ("gang", 0.05),
)


def _pick(rng: random.Random, mix: tuple[tuple[str, float], ...]) -> str:
    names = [n for n, _ in mix]
    weights = [w for _, w in mix]
    return rng.choices(names, weights)[0]


# ----------------------------------------------------------------------------- cluster


@dataclass
class World:
    """A built scale: the cluster, leaf metadata and a job factory."""

    scale: Scale
    cluster: Cluster
    leaves: list[str]
    leaf_weight: list[float]
    home: dict[str, list[str]]  # leaf -> pools it has quota in (preferred pools)
    pool_gpus: dict[str, int]
    rng: random.Random
    counter: int = 0
    true_end: dict[str, float] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return sum(self.pool_gpus.values())


def build_cluster(scale: Scale, rng: random.Random) -> World:
    pools = [p for p, _ in scale.pools]
    # Nodes: per pool, racks of 16-32 nodes, 8 racks to a block.
    counts = {p: round(scale.nodes * share) for p, share in scale.pools}
    counts[pools[0]] += scale.nodes - sum(counts.values())
    node_entries: list[dict[str, Any]] = []
    for pool in pools:
        left, rack = counts[pool], 0
        while left > 0:
            size = min(left, rng.randint(16, 32))
            node_entries.append(
                {
                    "name_prefix": f"{pool}-r{rack:03d}-n",
                    "count": size,
                    "start": 0,
                    "pool": pool,
                    "capacity": {
                        "gpu": GPUS_PER_NODE,
                        "cpu": NODE_CPU,
                        "memory": f"{NODE_MEMORY_GI}Gi",
                    },
                    "topology": {
                        "rack": f"{pool}-r{rack:03d}",
                        "block": f"{pool}-b{rack // 8:02d}",
                    },
                }
            )
            left -= size
            rack += 1
    pool_gpus = {p: counts[p] * GPUS_PER_NODE for p in pools}

    # Leaves: each has quota in 1-2 "home" pools (~5% have none: borrowers only).
    leaves = [f"q{i:03d}" for i in range(scale.queues)]
    home: dict[str, list[str]] = {}
    pool_weights = [share for _, share in scale.pools]
    for leaf in leaves:
        first = rng.choices(pools, pool_weights)[0]
        chosen = [first]
        if rng.random() < 0.35:
            second = rng.choice([p for p in pools if p != first])
            chosen.append(second)
        home[leaf] = chosen
    no_quota = {leaf for leaf in leaves if rng.random() < 0.05}
    # Nominal quotas: 90% of each pool's GPUs, split by random weights, whole GPUs.
    quota: dict[str, dict[str, int]] = {leaf: {} for leaf in leaves}
    for pool in pools:
        holders = [leaf for leaf in leaves if pool in home[leaf] and leaf not in no_quota]
        if not holders:
            continue
        weights = [rng.lognormvariate(0, 0.8) for _ in holders]
        budget = int(pool_gpus[pool] * 0.9)
        total_w = sum(weights)
        for leaf, w in zip(holders, weights, strict=True):
            share = int(budget * w / total_w)
            if share > 0:
                quota[leaf][pool] = share

    specs: dict[str, dict[str, Any]] = {}
    for leaf in leaves:
        spec: dict[str, Any] = {"name": leaf, "weight": rng.choice([1.0, 1.0, 1.0, 2.0])}
        if quota[leaf]:
            spec["quota"] = {p: {"gpu": g} for p, g in quota[leaf].items()}
            roll = rng.random()
            if roll < 0.2:  # may at most double its quota by borrowing
                spec["borrowing_limit"] = {p: {"gpu": g} for p, g in quota[leaf].items()}
            elif roll < 0.3:  # keeps half of its quota back from lending
                spec["lending_limit"] = {p: {"gpu": max(0, g // 2)} for p, g in quota[leaf].items()}
        if rng.random() < 0.3 and quota[leaf]:
            spec["pools"] = sorted(quota[leaf])  # restricted to its home pools
        specs[leaf] = spec
    departments: list[dict[str, Any]] = [
        {"name": f"dept{d:02d}", "children": []} for d in range(scale.departments)
    ]
    for i, leaf in enumerate(leaves):
        departments[i % scale.departments]["children"].append(specs[leaf])

    data = {
        "pools": [{"name": p} for p in pools],
        "nodes": node_entries,
        "queues": departments,
    }
    file = validate_model(ClusterFile, data, source="bench")
    cluster = Cluster.from_file(file, source="bench")
    # Busy queues get more jobs: activity ~ quota plus a lognormal factor.
    leaf_weight = [(1 + sum(quota[leaf].values())) * rng.lognormvariate(0, 0.7) for leaf in leaves]
    for leaf in leaves:  # the preferred pools of a job are those its queue may use
        allowed = cluster.allowed_pools(cluster.queues[leaf])
        home[leaf] = [p for p in home[leaf] if p in allowed] or allowed
    return World(scale, cluster, leaves, leaf_weight, home, pool_gpus, rng)


# ----------------------------------------------------------------------------- jobs


def _gpu_request(gpus: int) -> dict[str, int]:
    return {
        GPU: gpus * MILLI,
        "cpu": gpus * CPU_PER_GPU * MILLI,
        "memory": gpus * MEM_GI_PER_GPU * GI,
    }


def make_job(world: World, now: float, *, prefix: str = "j") -> PendingJob:
    rng = world.rng
    world.counter += 1
    job_id = f"{prefix}{world.counter:07d}"
    leaf = rng.choices(world.leaves, world.leaf_weight)[0]
    shape = _pick(rng, SHAPE_MIX)
    if shape == "cpu":
        cpus = rng.choice([2, 4, 8, 16])
        replicas = (
            ReplicaRequest(count=1, resources={"cpu": cpus * MILLI, "memory": cpus * 4 * GI}),
        )
    elif shape == "gang":
        replicas = (ReplicaRequest(count=rng.randint(2, 8), resources=_gpu_request(8)),)
    else:
        replicas = (ReplicaRequest(count=1, resources=_gpu_request(int(shape[1:]))),)
    klass = _pick(rng, CLASS_MIX)
    pools: tuple[str, ...] = ()
    if rng.random() < 0.5:
        pools = (rng.choice(world.home[leaf]),)
    expected = min(3 * 86400.0, max(300.0, rng.lognormvariate(math.log(7200), 1.0)))
    roll = rng.random()
    expected_runtime: float | None = None
    max_runtime: float | None = None
    if roll < 0.7:
        expected_runtime = expected
        if rng.random() < 0.5:
            max_runtime = 2 * expected
    elif roll < 0.9:
        max_runtime = min(7 * 86400.0, 2 * expected)
    # The true duration, never shown to the scheduler.
    world.true_end[job_id] = expected * rng.uniform(0.3, 1.2)
    return PendingJob(
        id=job_id,
        queue=leaf,
        priority_class=klass,
        submit_time=now - min(86400.0, rng.expovariate(1 / 3600.0)),
        replicas=replicas,
        pools=pools,
        max_runtime=max_runtime,
        expected_runtime=expected_runtime,
    )


def to_running(job: PendingJob, admit: Any, start: float) -> RunningJob:
    running: RunningJob = admit.running(job, at=start)
    return running


def seed_running(world: World, target: float = 0.5) -> tuple[list[RunningJob], dict[str, Any]]:
    """Admit jobs with schedule_once until ``target`` of the GPUs are held, then age them
    (start times in the past, expected ends in the future)."""
    rng = world.rng
    goal = int(world.total_gpus * target) * MILLI
    running: dict[str, RunningJob] = {}
    held = 0
    seed_time = 0.0
    rounds = 0
    backlog: list[PendingJob] = []
    while held < goal and rounds < 12:
        rounds += 1
        want = goal - held - sum(j.gpus for j in backlog)
        while want > 0:
            job = make_job(world, NOW, prefix="s")
            backlog.append(job)
            want -= job.gpus
        snap = Snapshot(
            now=NOW, cluster=world.cluster, pending=list(backlog), running=list(running.values())
        )
        t0 = time.perf_counter()
        decisions = schedule_once(snap)
        seed_time += time.perf_counter() - t0
        by_id = {j.id: j for j in backlog}
        for admit in decisions.admitted:
            job = by_id.pop(admit.job)
            # Age it: it started some time ago and is expected to end later.
            span = job.expected_runtime or job.max_runtime or 4 * 3600.0
            start = NOW - rng.uniform(0.05, 0.9) * span
            running[job.id] = to_running(job, admit, start)
            world.true_end[job.id] = start + world.true_end.get(job.id, span)
            world.true_end[job.id] = max(world.true_end[job.id], NOW + 60)
            held += job.gpus
        # Drop what did not fit (it would only distort the seed).
        backlog = [] if rounds % 3 == 0 else list(by_id.values())[: len(by_id) // 4]
    info = {
        "seed_rounds": rounds,
        "seed_sched_s": round(seed_time, 3),
        "held_gpu_frac": round(held / (world.total_gpus * MILLI), 3),
    }
    return list(running.values()), info


# ----------------------------------------------------------------------------- measuring


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def phase_breakdown(snap: Snapshot) -> dict[str, float] | None:
    """One cycle split into its phases (reads private names of cycle.py; None if they
    changed)."""
    try:
        from allotment.scheduler import cycle as cyc
        from allotment.scheduler.lines import group_lines
        from allotment.scheduler.state import CycleState

        out: dict[str, float] = {}
        t0 = time.perf_counter()
        state = CycleState.from_snapshot(snap)
        out["state"] = time.perf_counter() - t0
        c = cyc._Cycle(state=state, decisions=Decisions(now=snap.now))
        t0 = time.perf_counter()
        classes = {name: k.value for name, k in snap.cluster.priority_classes.items()}
        queues, preemptors = group_lines(snap.pending, classes)
        lines = c.lines(queues, preemptors)
        out["lines"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        c.nominated()
        out["nominated"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        c.run(lines)
        out["run"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        c.rest(lines)
        out["rest"] = time.perf_counter() - t0
        return {k: round(v * 1000, 1) for k, v in out.items()}
    except (AttributeError, TypeError, ImportError):
        return None


def measure_cycles(snap: Snapshot, n: int) -> dict[str, Any]:
    times: list[float] = []
    decisions: Decisions | None = None
    for _ in range(n):
        gc.collect()
        dt, decisions = timed(lambda: schedule_once(snap))
        times.append(dt * 1000)
    assert decisions is not None
    reasons: dict[str, int] = {}
    for reason in decisions.waiting.values():
        reasons[reason.code.value] = reasons.get(reason.code.value, 0) + 1
    return {
        "cycles": n,
        "p50_ms": round(statistics.median(times), 1),
        "p99_ms": round(pct(times, 99), 1),
        "max_ms": round(max(times), 1),
        "min_ms": round(min(times), 1),
        "admitted": len(decisions.admitted),
        "admitted_gpus": sum(
            p.resources.get(GPU, 0) for a in decisions.admitted for p in a.placements
        )
        // MILLI,
        "stats": decisions.stats,
        "waiting_by_reason": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
    }


@dataclass
class _Tally:
    """What a sustained run counts: the first (fill) cycle apart, then every cycle."""

    sched: float = 0.0
    admitted: int = 0
    preempted: int = 0
    finished: int = 0
    cycles: int = 0
    times: list[float] = field(default_factory=list)
    per_cycle: list[int] = field(default_factory=list)
    first: dict[str, Any] = field(default_factory=dict)
    wall0: float = field(default_factory=time.perf_counter)

    def count(self, dt: float, decisions: Any, victims: int) -> None:
        if self.cycles == 0:
            self.first = {
                "ms": round(dt * 1000, 1),
                "admitted": len(decisions.admitted),
                "preemptions": len(decisions.preemptions),
            }
        else:
            self.sched += dt
            self.admitted += len(decisions.admitted)
            self.preempted += victims
            self.times.append(dt * 1000)
            self.per_cycle.append(len(decisions.admitted))
        self.cycles += 1

    def done(self, *, seconds: float, max_cycles: int, wall_limit: float) -> bool:
        return self.cycles > 1 and (
            self.sched >= seconds
            or self.cycles - 1 >= max_cycles
            or time.perf_counter() - self.wall0 >= wall_limit
        )

    def summary(self, *, running_end: int) -> dict[str, Any]:
        times, sched = self.times, self.sched
        return {
            "fill_cycle": self.first,
            "cycles": len(times),
            "sched_s": round(sched, 2),
            "wall_s": round(time.perf_counter() - self.wall0, 1),
            "admitted": self.admitted,
            "adm_per_s": round(self.admitted / sched, 1) if sched else 0.0,
            "adm_per_cycle": round(statistics.mean(self.per_cycle), 1) if self.per_cycle else 0,
            "cycle_p50_ms": round(statistics.median(times), 1) if times else 0,
            "cycle_p99_ms": round(pct(times, 99), 1) if times else 0,
            "victims": self.preempted,
            "finished": self.finished,
            "running_end": running_end,
        }


def sustained(
    world: World,
    running_list: list[RunningJob],
    pending_list: list[PendingJob],
    *,
    seconds: float,
    max_cycles: int,
    churn: float,
    step: float,
    wall_limit: float,
    policy: SchedulerPolicy,
) -> dict[str, Any]:
    """Cycles over an evolving world; only schedule_once counts as scheduler time.

    Each cycle: admitted jobs start; preemption victims are marked terminating and are
    gone by the next cycle; time moves ``step`` seconds; running jobs past their true
    end finish, plus ``churn`` of the rest at random; new jobs keep the backlog at its
    starting size. The first cycle (the fill of the free half) is reported apart."""
    rng = world.rng
    target = len(pending_list)
    pending = {j.id: j for j in pending_list}
    running = {j.id: j for j in running_list}
    now = NOW
    tally = _Tally()
    while True:
        snap = Snapshot(
            now=now,
            cluster=world.cluster,
            pending=list(pending.values()),
            running=list(running.values()),
            policy=policy,
        )
        gc.collect()
        dt, decisions = timed(lambda snap=snap: schedule_once(snap))
        for admit in decisions.admitted:
            job = pending.pop(admit.job)
            running[job.id] = to_running(job, admit, now)
            world.true_end[job.id] = now + world.true_end.get(job.id, 3600.0)
        victims_now = 0
        for pre in decisions.preemptions:
            ids = tuple(v.job for v in pre.victims)
            for vid in ids:
                if vid in running and not running[vid].terminating:
                    running[vid].terminating = True
                    victims_now += 1
            pending[pre.job].preempting = ids
        tally.count(dt, decisions, victims_now)
        if tally.done(seconds=seconds, max_cycles=max_cycles, wall_limit=wall_limit):
            break
        # Time passes: victims are gone, some jobs end, new ones arrive.
        now += step
        for jid in [j for j, r in running.items() if r.terminating]:
            del running[jid]
        ended = [j for j in running if world.true_end.get(j, math.inf) <= now]
        rest = [j for j in running if world.true_end.get(j, math.inf) > now]
        ended += rng.sample(rest, int(len(rest) * churn))
        for jid in ended:
            del running[jid]
        tally.finished += len(ended)
        while len(pending) < target:
            job = make_job(world, now)
            job.submit_time = now - rng.uniform(0, step)
            pending[job.id] = job
    return tally.summary(running_end=len(running))


def sustained_session(
    world: World,
    running_list: list[RunningJob],
    pending_list: list[PendingJob],
    *,
    seconds: float,
    max_cycles: int,
    churn: float,
    step: float,
    wall_limit: float,
    policy: SchedulerPolicy,
    prof: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """:func:`sustained` with an incremental :class:`Session` told what changed.

    The world evolves exactly as in :func:`sustained` (same order of running jobs, same
    draws from ``world.rng``), so one seed gives the same world and the same fill cycle
    in both modes; later cycles can drift apart on placement ties (bench/README.md). Only
    ``session.cycle(now)`` (explain on) counts as scheduler time; building the session
    from the starting snapshot is timed apart. ``prof``, if given, is enabled around
    each cycle only."""
    rng = world.rng
    target = len(pending_list)
    start = Snapshot(
        now=NOW,
        cluster=world.cluster,
        pending=list(pending_list),
        running=list(running_list),
        policy=policy,
    )
    gc.collect()
    build_s, session = timed(lambda: Session.from_snapshot(start))
    print(f"session built in {build_s * 1000:.1f} ms", flush=True)
    running = session.running  # the session's own view: insertion order as in sustained()
    now = NOW
    tally = _Tally()
    while True:
        gc.collect()
        if prof is not None:
            prof.enable()
        dt, decisions = timed(lambda now=now: session.cycle(now))
        if prof is not None:
            prof.disable()
        for admit in decisions.admitted:  # already running inside the session
            world.true_end[admit.job] = now + world.true_end.get(admit.job, 3600.0)
        victims_now = 0
        for pre in decisions.preemptions:
            ids = tuple(v.job for v in pre.victims)
            for vid in ids:
                if vid in running and not running[vid].terminating:
                    session.stopping(vid)
                    victims_now += 1
            job = session.pending_job(pre.job)
            assert job is not None, pre.job
            session.update(replace(job, preempting=ids))
        tally.count(dt, decisions, victims_now)
        if tally.done(seconds=seconds, max_cycles=max_cycles, wall_limit=wall_limit):
            break
        # Time passes: victims are gone, some jobs end, new ones arrive.
        now += step
        for jid in [j for j, r in running.items() if r.terminating]:
            session.gone(jid)
        ended = [j for j in running if world.true_end.get(j, math.inf) <= now]
        rest = [j for j in running if world.true_end.get(j, math.inf) > now]
        ended += rng.sample(rest, int(len(rest) * churn))
        for jid in ended:
            session.gone(jid)
        tally.finished += len(ended)
        while session.pending_count < target:
            job = make_job(world, now)
            job.submit_time = now - rng.uniform(0, step)
            session.submit(job)
    return {
        "session_build_ms": round(build_s * 1000, 1),
        **tally.summary(running_end=len(running)),
    }


def peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0)


# ----------------------------------------------------------------------------- driver


POLICIES: dict[str, Callable[[], SchedulerPolicy]] = {
    "default": SchedulerPolicy,
    "no-preemption": lambda: SchedulerPolicy(name="no-preemption", preemption=False, reclaim=False),
    "no-backfill": lambda: SchedulerPolicy(name="no-backfill", backfill=False),
}


def build(
    scale: Scale, seed: int, policy: str = "default"
) -> tuple[World, Snapshot, dict[str, Any]]:
    rng = random.Random(f"{seed}-{scale.name}")
    info: dict[str, Any] = {}
    dt, world = timed(lambda: build_cluster(scale, rng))
    info["cluster_s"] = round(dt, 2)
    dt, (running, seed_info) = timed(lambda: seed_running(world))
    info["seed_s"] = round(dt, 2)
    info.update(seed_info)
    dt, pending = timed(lambda: [make_job(world, NOW) for _ in range(scale.pending)])
    info["pending_s"] = round(dt, 2)
    snap = Snapshot(
        now=NOW, cluster=world.cluster, pending=pending, running=running, policy=POLICIES[policy]()
    )
    info["running"] = len(running)
    return world, snap, info


def run_scale(scale: Scale, args: argparse.Namespace) -> dict[str, Any]:
    print(
        f"\n== {scale.name}: {scale.nodes} nodes, {scale.pending} pending, "
        f"{scale.queues} queues ==",
        flush=True,
    )
    t0 = time.perf_counter()
    world, snap, build_info = build(scale, args.seed, args.policy)
    build_s = time.perf_counter() - t0
    print(
        f"built in {build_s:.1f}s ({world.total_gpus} GPUs, {len(snap.running)} running, "
        f"{build_info['held_gpu_frac']:.0%} GPUs held; {build_info})",
        flush=True,
    )

    cyc = measure_cycles(snap, args.cycles)
    phases = phase_breakdown(snap) if args.phases else None
    print(
        f"cycle x{args.cycles}: p50 {cyc['p50_ms']} ms, p99 {cyc['p99_ms']} ms, "
        f"max {cyc['max_ms']} ms; admitted {cyc['admitted']} jobs "
        f"({cyc['admitted_gpus']} GPUs); stats {cyc['stats']}",
        flush=True,
    )
    print(f"  phases (ms): {phases}", flush=True)
    print(f"  waiting: {cyc['waiting_by_reason']}", flush=True)

    sus: dict[str, Any] = {}
    if args.sustain_seconds > 0 and args.session:
        prof = cProfile.Profile() if args.profile_session else None
        sus = sustained_session(
            world,
            list(snap.running),
            list(snap.pending),
            seconds=args.sustain_seconds,
            max_cycles=args.sustain_cycles,
            churn=args.churn,
            step=args.step,
            wall_limit=args.sustain_wall,
            policy=snap.policy,
            prof=prof,
        )
        print(f"sustained (session): {sus}", flush=True)
        if prof is not None:
            print_profile(prof, args, f"the {scale.name} session's sustained cycles")
    elif args.sustain_seconds > 0:
        sus = sustained(
            world,
            list(snap.running),
            list(snap.pending),
            seconds=args.sustain_seconds,
            max_cycles=args.sustain_cycles,
            churn=args.churn,
            step=args.step,
            wall_limit=args.sustain_wall,
            policy=snap.policy,
        )
        print(f"sustained: {sus}", flush=True)

    result = {
        "scale": scale.name,
        "policy": args.policy,
        "nodes": scale.nodes,
        "gpus": world.total_gpus,
        "queues": scale.queues,
        "pending": len(snap.pending),
        "running": len(snap.running),
        "build_s": round(build_s, 1),
        "cycle": {
            k: cyc[k] for k in ("cycles", "p50_ms", "p99_ms", "max_ms", "admitted", "admitted_gpus")
        }
        | {"stats": cyc["stats"]},
        "phases_ms": phases,
        "sustained": {
            k: sus[k]
            for k in (
                "cycles",
                "sched_s",
                "admitted",
                "adm_per_s",
                "adm_per_cycle",
                "cycle_p50_ms",
                "cycle_p99_ms",
                "victims",
                "finished",
            )
        }
        if sus
        else None,
        "peak_rss_mib": peak_rss_mib(),
    }
    if args.session:
        result["session"] = True
        if sus:
            result["sustained"] |= {"session_build_ms": sus["session_build_ms"]}
    if args.profile and scale.name == args.profile_scale:
        profile(snap, args)
    del world, snap
    gc.collect()
    return result


def profile(snap: Snapshot, args: argparse.Namespace) -> None:
    print(
        f"\n-- cProfile of one {args.profile_scale} cycle (top {args.profile_top} by "
        "cumulative time) --",
        flush=True,
    )
    prof = cProfile.Profile()
    prof.enable()
    schedule_once(snap)
    prof.disable()
    print_profile(prof, args)


def print_profile(prof: cProfile.Profile, args: argparse.Namespace, what: str = "") -> None:
    if what:
        print(
            f"\n-- cProfile of {what} (top {args.profile_top} by cumulative time; "
            "timings above are inflated by it) --",
            flush=True,
        )
    if args.profile_out:
        prof.dump_stats(args.profile_out)
    for order in ("cumulative", "tottime"):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(order)
        stats.print_stats(args.profile_top)
        text = buf.getvalue()
        start = text.find("   ncalls")
        print(f"[sorted by {order}]")
        print(text[start:].rstrip() if start >= 0 else text.rstrip(), flush=True)


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'scale':<7}{'nodes':>6}{'GPUs':>7}{'queues':>7}{'pending':>8}{'running':>8}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'adm/cyc':>8}{'sus p50':>9}{'sus adm/c':>10}"
        f"{'adm/s':>8}"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        s = r["sustained"] or {}
        rows.append(
            f"{r['scale']:<7}{r['nodes']:>6}{r['gpus']:>7}{r['queues']:>7}{r['pending']:>8}"
            f"{r['running']:>8}{r['cycle']['p50_ms']:>9}{r['cycle']['p99_ms']:>9}"
            f"{r['cycle']['admitted']:>8}{s.get('cycle_p50_ms', '-'):>9}"
            f"{s.get('adm_per_cycle', '-'):>10}{s.get('adm_per_s', '-'):>8}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=[*SCALES, "all"], default="small")
    parser.add_argument("--cycles", type=int, default=7, help="cycles on the same snapshot")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sustain-seconds",
        type=float,
        default=20.0,
        help="scheduler seconds of the sustained run (0: skip it)",
    )
    parser.add_argument(
        "--sustain-cycles",
        type=int,
        default=1000,
        help="stop the sustained run after this many cycles",
    )
    parser.add_argument(
        "--sustain-wall",
        type=float,
        default=240.0,
        help="stop the sustained run after this many wall seconds",
    )
    parser.add_argument(
        "--churn",
        type=float,
        default=0.03,
        help="share of running jobs that also end each sustained cycle",
    )
    parser.add_argument(
        "--step", type=float, default=30.0, help="simulated seconds between sustained cycles"
    )
    parser.add_argument(
        "--policy",
        choices=list(POLICIES),
        default="default",
        help="scheduler policy for every cycle",
    )
    parser.add_argument(
        "--session",
        action="store_true",
        help="drive the sustained run through an incremental Session (told what changed) "
        "instead of a new snapshot and schedule_once each cycle",
    )
    parser.add_argument(
        "--profile-session",
        action="store_true",
        help="with --session: cProfile the sustained session cycles (inflates their times)",
    )
    parser.add_argument(
        "--phases", action="store_true", help="also time one extra cycle phase by phase"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile one cycle of --profile-scale (default large)",
    )
    parser.add_argument("--profile-scale", choices=list(SCALES), default="large")
    parser.add_argument("--profile-top", type=int, default=15)
    parser.add_argument("--profile-out", default=None, help="also dump pstats here")
    args = parser.parse_args(argv)

    names = list(SCALES) if args.scale == "all" else [args.scale]
    if args.profile and args.profile_scale not in names:
        names.append(args.profile_scale)
    results = [run_scale(SCALES[name], args) for name in names]
    print("\n" + table(results))
    for r in results:
        print("BENCH " + json.dumps(r, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
