"""Replay speed at saturation: every preset at every load, one replay at a time.

Replays a trace (by default the Philly window) compressed to each load (``--loads 8 16``:
submit times multiplied by 1/8 and 1/16) under each preset, one after the other on one
core, each in a fresh process, and prints per replay its wall and CPU seconds, the
scheduler's share of them, the cycles run, the average wait and JCT, and whether it is
within ``--target-s`` (60 s)::

    PYTHONPATH=src:. python bench/bench_replay.py                       # 8x and 16x, all presets
    PYTHONPATH=src:. python bench/bench_replay.py --loads 8 --presets default borrowing
    PYTHONPATH=src:. python bench/bench_replay.py --trace synth/trace.csv -f synth/cluster.yaml

Machines are shared and noisy: compare runs made one after the other, and prefer the CPU
seconds (what the replay itself used) to the wall.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster
from allotment.sim.metrics import summarize
from allotment.sim.policies import parse_policy
from allotment.sim.replay import Replay
from allotment.sim.trace import TraceJob, check_trace
from allotment.sim.trace_formats import load_trace

PHILLY = Path(__file__).resolve().parent.parent / "traces" / "philly_helios_window_11vc.csv"
PRESETS = ("fifo-isolated", "backfill", "borrowing", "fair-share", "default")


def load(trace: Path, cluster_file: Path | None, first: int = 0) -> tuple[Cluster, list[TraceJob]]:
    """The trace's jobs (the ``first`` submitted only, when not 0) and the cluster to
    replay them on (its node file's, or ``-f``)."""
    given = None if cluster_file is None else load_cluster(cluster_file)
    loaded = load_trace(trace, build_cluster=given is None)
    cluster = given if given is not None else loaded.cluster
    if cluster is None:
        raise SystemExit(f"{trace}: no cluster; give one with -f")
    jobs = list(loaded.jobs)
    if first:
        jobs = sorted(jobs, key=lambda j: j.submit_time)[:first]
    check_trace(jobs, cluster, source=str(trace))
    return cluster, jobs


def replay_once(
    cluster: Cluster, jobs: list[TraceJob], preset: str, load_factor: float
) -> dict[str, Any]:
    """One replay, timed: the summary ``allot sim -o json`` prints, with CPU seconds."""
    gc.collect()
    cpu = time.process_time()
    result = Replay(cluster, jobs, parse_policy(preset), time_scale=1.0 / load_factor).run()
    cpu = time.process_time() - cpu
    summary = summarize(result)
    summary.update(load=load_factor, cpu_s=round(cpu, 3))
    return summary


def replay_fresh(
    trace: Path, cluster_file: Path | None, first: int, preset: str, load_factor: float
) -> dict[str, Any]:
    """:func:`replay_once` in a process of its own, as ``allot sim`` runs one (no replay
    runs on the memory another left behind)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(_in_child, trace, cluster_file, first, preset, load_factor).result()


def _in_child(
    trace: Path, cluster_file: Path | None, first: int, preset: str, load_factor: float
) -> dict[str, Any]:
    cluster, jobs = load(trace, cluster_file, first)
    return replay_once(cluster, jobs, preset, load_factor)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=PHILLY)
    parser.add_argument("-f", "--cluster", type=Path, default=None, help="cluster file")
    parser.add_argument("--loads", type=float, nargs="+", default=[8.0, 16.0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument(
        "--first", type=int, default=0, help="replay only the first N jobs (0: all)"
    )
    parser.add_argument("--target-s", type=float, default=60.0)
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = parser.parse_args(argv)
    if any(f <= 0 for f in args.loads):
        parser.error("--loads must be positive")
    for preset in args.presets:
        try:
            parse_policy(preset)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        load(args.trace, args.cluster, args.first)  # a bad trace or cluster fails here, once
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    rows: list[dict[str, Any]] = []
    if not args.json:
        print(
            f"{'load':>5} {'preset':<14} {'wall s':>8} {'cpu s':>8} {'sched s':>8} "
            f"{'cycles':>8} {'wait avg s':>11} {'JCT avg s':>10} {'viol.':>6}  target"
        )
    for factor in args.loads:
        for preset in args.presets:
            row = replay_fresh(args.trace, args.cluster, args.first, preset, factor)
            rows.append(row)
            if not args.json:
                met = "met" if row["wall_s"] <= args.target_s else "NOT met"
                print(
                    f"{factor:>4g}x {preset:<14} {row['wall_s']:>8.1f} {row['cpu_s']:>8.1f} "
                    f"{row['scheduler_s']:>8.1f} {row['cycles']:>8,} "
                    f"{row['wait_avg_s']:>11,.1f} {row['jct_avg_s']:>10,.0f} "
                    f"{row['guarantee_violations']:>6}  {met} (<= {args.target_s:g} s)",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
