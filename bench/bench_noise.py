"""How much of a difference between policies is chance: replays of jittered copies.

At saturation a replay is chaotic: the order of two jobs submitted in the same second,
or which of two equal nodes a job lands on, changes every later decision, and a trace's
average wait can move by a fifth. This replays a trace as given and as ``--copies``
jittered copies (``allot sim --jitter-seed 1 .. N``: every job submitted up to one second
later) under each preset, and prints per preset the mean, lowest and highest of the
average wait, the average JCT and the guarantee violations over the copies, with the
mean's ratio to the best mean::

    PYTHONPATH=src:. python bench/bench_noise.py synth95/trace.csv -f synth95/cluster.yaml
    PYTHONPATH=src:. python bench/bench_noise.py --time-scale 0.125 --copies 2 \\
        --presets borrowing fair-share default                   # the Philly window at 8x

A difference between two presets' means that is smaller than the spread of either over
the copies is chance, not policy.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from bench.bench_replay import PHILLY, load

from allotment.domain.errors import AllotmentError
from allotment.sim.metrics import summarize
from allotment.sim.policies import parse_policy
from allotment.sim.replay import Replay
from allotment.sim.trace import jittered

PRESETS = ("borrowing", "fair-share", "default")
FIGURES = ("wait_avg_s", "jct_avg_s", "guarantee_violations")


def replay_copy(
    trace: Path, cluster_file: Path | None, preset: str, seed: int, time_scale: float
) -> dict[str, Any]:
    """One replay of copy ``seed`` (0: the trace as given) under ``preset``."""
    cluster, jobs = load(trace, cluster_file)
    if seed:
        jobs = jittered(jobs, seed)
    summary = summarize(Replay(cluster, jobs, parse_policy(preset), time_scale=time_scale).run())
    return {"preset": preset, "seed": seed, **{k: summary[k] for k in FIGURES}}


def spread(runs: list[dict[str, Any]], presets: list[str]) -> list[dict[str, Any]]:
    """Per preset, each figure's mean, lowest and highest over the copies, and the
    mean's ratio to the best preset's mean (1.0: the best)."""
    rows: list[dict[str, Any]] = []
    for preset in presets:
        mine = [r for r in runs if r["preset"] == preset]
        row: dict[str, Any] = {"preset": preset, "copies": len(mine)}
        for figure in FIGURES:
            values = [float(r[figure]) for r in mine]
            row[figure] = {
                "mean": statistics.fmean(values),
                "low": min(values),
                "high": max(values),
                "as_given": next(float(r[figure]) for r in mine if r["seed"] == 0),
            }
        rows.append(row)
    for figure in ("wait_avg_s", "jct_avg_s"):
        best = min(row[figure]["mean"] for row in rows)
        for row in rows:
            row[figure]["to_best"] = row[figure]["mean"] / best if best else 1.0
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the replays and print the table (or JSON); the rows, for tests."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=PHILLY)
    parser.add_argument("-f", "--cluster", type=Path, default=None)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--copies", type=int, default=4, help="jittered copies (seeds 1..N)")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2, help="replays at a time")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.copies < 1:
        parser.error("--copies must be at least 1")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if not (0 <= args.time_scale < float("inf")):
        parser.error(f"--time-scale must be a finite number >= 0, got {args.time_scale}")
    for preset in args.presets:
        try:
            parse_policy(preset)  # a bad name fails here, not in a worker
        except AllotmentError as exc:
            parser.error(exc.message)
    for path in (args.trace, args.cluster):
        if path is not None and not path.is_file():
            parser.error(f"{path}: no such file")
    tasks = [
        (args.trace, args.cluster, preset, seed, args.time_scale)
        for seed in range(args.copies + 1)
        for preset in args.presets
    ]
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=get_context("spawn")) as pool:
        runs = list(pool.map(replay_copy, *zip(*tasks, strict=True)))
    rows = spread(runs, args.presets)
    if args.json:
        print(json.dumps(rows, indent=2))
        return rows
    print(f"{args.trace} x {args.time_scale:g}: as given and {args.copies} jittered copies")
    print(
        f"{'preset':<20} {'wait avg: mean (low-high)':>34} {'to best':>8} "
        f"{'JCT avg: mean (low-high)':>30} {'to best':>8} {'violations':>14} {'as given':>20}"
    )
    for row in rows:
        wait, jct, bad = row["wait_avg_s"], row["jct_avg_s"], row["guarantee_violations"]
        print(
            f"{row['preset']:<20} "
            f"{wait['mean']:>12,.1f} ({wait['low']:,.1f}-{wait['high']:,.1f}) "
            f"{wait['to_best']:>8.3f} "
            f"{jct['mean']:>10,.0f} ({jct['low']:,.0f}-{jct['high']:,.0f}) "
            f"{jct['to_best']:>8.3f} "
            f"{bad['mean']:>5.1f} ({bad['low']:.0f}-{bad['high']:.0f}) "
            f"{wait['as_given']:>9,.1f} / {jct['as_given']:,.0f}"
        )
    return rows


if __name__ == "__main__":
    main()
