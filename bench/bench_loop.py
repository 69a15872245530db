"""The control loop alone, on the jobs of Kueue's baseline, with no API.

Not a test. The jobs of ``--share`` of bench_kueue's baseline (0.3: 4,500 jobs) are
submitted all at once, before any timing, in-process through the service the API uses
(``JobService.submit_many``, in batches of the API's largest), into a fresh store
(SQLite in a temporary directory, or ``--db`` for an empty PostgreSQL database). Then
``LoopRunner.turn()`` is called back to back, on a :class:`ControlLoop` with a
:class:`TimedExecutor` built as bench_kueue's drain builds them, until every job has
succeeded. Each turn is timed on the wall and the process's CPU clock.

It prints per run the jobs, the turns, the wall seconds spent in turns, their CPU
seconds, the CPU milliseconds per turn (median and mean) and the preemptions; with
``--repeat`` the median of each.

Run ``python bench/bench_loop.py --help``; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from bench.bench_kueue import (
    TERMINAL,
    Config,
    _finished,
    _timed_loop,
    arrivals,
    cluster_yaml,
    scaled,
    store,
)
from sqlalchemy import func, select

from allotment.api.service import MAX_BATCH, JobService
from allotment.control.runner import DEFAULT_RECONCILE_EVERY_S, LoopRunner
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.store.models import Event, Job

SUCCEEDED = JobState.SUCCEEDED.value


@dataclass(frozen=True)
class LoopRun:
    jobs: int
    turns: int
    wall_s: float
    """Wall seconds spent inside ``turn()``."""
    cpu_s: float
    """CPU seconds (``time.process_time``) spent inside ``turn()``."""
    cpu_ms_p50: float
    cpu_ms_mean: float
    preemptions: int
    states: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.states == {SUCCEEDED: self.jobs}


def run(config: Config, *, timeout_s: float = 1_800.0) -> LoopRun:
    """Store every job of ``config`` through :class:`JobService`, then turn the loop
    until none is left to run (or ``timeout_s`` of turns have passed)."""
    cluster = load_cluster_text(cluster_yaml(config), source="bench")
    texts = [a.text for a in arrivals(config)]
    with store(config.db_url) as (sessions, tmp):
        with sessions() as db:
            before = db.scalar(select(func.count()).select_from(Job))
        if before:
            raise RuntimeError(f"the store already holds {before} jobs; give a fresh database")
        service = JobService(cluster=cluster, sessions=sessions, clock=time.time)
        for i in range(0, len(texts), MAX_BATCH):
            service.submit_many(spec_texts=texts[i : i + MAX_BATCH])
        runner = LoopRunner(_timed_loop(cluster, sessions, tmp / "work"), tick_s=config.tick_s)
        walls: list[float] = []
        cpus: list[float] = []
        next_reconcile = spent = 0.0
        while True:
            states = _finished(sessions)
            ended = sum(n for s, n in states.items() if s in TERMINAL)
            if ended >= len(texts) or spent > timeout_s:
                break
            reconcile = time.monotonic() >= next_reconcile  # as the runner's thread does
            w0, c0 = time.perf_counter(), time.process_time()
            runner.turn(reconcile=reconcile)
            cpus.append(time.process_time() - c0)
            walls.append(time.perf_counter() - w0)
            spent += walls[-1]
            if reconcile:
                next_reconcile = time.monotonic() + DEFAULT_RECONCILE_EVERY_S
        with sessions() as db:
            preemptions = db.scalar(
                select(func.count())
                .select_from(Event)
                .where(Event.to_state == JobState.PREEMPTED.value)
            )
    return LoopRun(
        jobs=len(texts),
        turns=len(walls),
        wall_s=spent,
        cpu_s=sum(cpus),
        cpu_ms_p50=1000 * statistics.median(cpus) if cpus else 0.0,
        cpu_ms_mean=1000 * statistics.fmean(cpus) if cpus else 0.0,
        preemptions=preemptions or 0,
        states=states,
    )


HEADER = f"  {'run':>6} {'jobs':>6} {'turns':>6} {'wall s':>7} {'CPU s':>7} "
HEADER += f"{'CPU ms/turn p50':>15} {'mean':>6} {'preemptions':>11}"


def _row(label: str, r: LoopRun) -> str:
    return (
        f"  {label:>6} {r.jobs:>6} {r.turns:>6} {r.wall_s:>7.2f} {r.cpu_s:>7.2f} "
        f"{r.cpu_ms_p50:>15.2f} {r.cpu_ms_mean:>6.2f} {r.preemptions:>11}"
    )


def median_run(runs: list[LoopRun]) -> LoopRun:
    """Each figure's median over ``runs`` (a run of its own only when there is one)."""

    def med(name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in runs))

    return LoopRun(
        jobs=runs[0].jobs,
        turns=round(med("turns")),
        wall_s=med("wall_s"),
        cpu_s=med("cpu_s"),
        cpu_ms_p50=med("cpu_ms_p50"),
        cpu_ms_mean=med("cpu_ms_mean"),
        preemptions=round(med("preemptions")),
        states=runs[0].states,
    )


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: a share must be a number > 0 and <= 1")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a whole number, at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--share", type=_share, default=0.3, help="share of each class's jobs (0.3: 4,500)"
    )
    parser.add_argument("--repeat", type=_positive, default=1, help="runs, a fresh store each")
    parser.add_argument(
        "--db", default=None, help="an empty database's URL (default: temporary SQLite)"
    )
    parser.add_argument("--json", action="store_true", help="print the runs as one JSON object")
    args = parser.parse_args(argv)
    if args.db and args.repeat > 1:
        parser.error("--db holds one run: give each run a fresh database (--repeat 1)")
    config = scaled(Config(db_url=args.db), args.share)
    runs: list[LoopRun] = []
    for _ in range(args.repeat):
        runs.append(run(config))
        if not runs[-1].ok:
            break
    status = 0 if all(r.ok for r in runs) and len(runs) == args.repeat else 1
    if args.json:
        median = asdict(median_run(runs))
        print(json.dumps({"share": args.share, "runs": [asdict(r) for r in runs], **median}))
        return status
    where = (args.db or "sqlite").split(":")[0].split("+")[0]  # the dialect, no credentials
    print(f"loop alone: {config.jobs} jobs (--share {args.share}), {where}, turns back to back")
    print(HEADER)
    for i, r in enumerate(runs, 1):
        print(_row(str(i), r))
    if len(runs) > 1:
        print(_row("median", median_run(runs)))
    for i, r in enumerate(runs, 1):
        if not r.ok:
            print(f"  run {i} did not end with every job succeeded: {r.states}")
    return status


if __name__ == "__main__":
    sys.exit(main())
