"""Kueue's scheduler-performance baseline, run through the live system.

Not a test. The whole of Allotment takes part: the HTTP API (FastAPI under uvicorn on
127.0.0.1, in a thread), the store (SQLite in a temporary directory, or ``--db`` for a
PostgreSQL URL), and the control loop driven by its :class:`LoopRunner`, on a
:class:`TimedExecutor` that starts no process and ends each job after its runtime, as
Kueue's own harness does.

The baseline (Kueue ``test/performance/scheduler``): 5 cohorts of 6 queues, each with a
nominal quota of 20 units, a borrowing limit of 100, preemption within the queue by
priority and reclaim within the cohort. Per queue: 350 small jobs (1 unit, 200 ms,
priority 50, one every 100 ms), 100 medium (5 units, 500 ms, priority 100, one every
500 ms), 50 large (20 units, 1 s, priority 200, one every 1.2 s): 15,000 jobs, 39,600
unit-seconds on 600 units, so at least 66 s of work. Kueue publishes a mean of 351 s to
drain it.

Two measurements:

* ``drain``: client threads submit the jobs through the API on the arrival schedule;
  figures are the drain time (first submission to the last job succeeded), its ratio to
  the work bound, the time to admission per class (from the store's events) and the
  preemptions.
* ``burst``: ``C`` concurrent clients submit as fast as they can (no control loop); the
  figure is accepted submissions per second.

Run ``python bench/bench_kueue.py --help``; see bench/README.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import multiprocessing
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.app import create_app
from allotment.api.auth import StoreTokens, new_token, token_digest
from allotment.api.serving import serve_in_thread
from allotment.client import AllotmentClient
from allotment.control.loop import ControlLoop
from allotment.control.runner import LoopRunner
from allotment.control.wake import WakeListener, WakeSender
from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.executors.timed import RUNTIME_ENV, TimedExecutor
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.models import Event, Job
from allotment.store.tokens import create_token

KUEUE_MEAN_DRAIN_S = 351.0
"""Kueue's published mean time to drain the baseline."""

POOL = "sim"

# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class JobClass:
    name: str
    units: int
    runtime_s: float
    priority: int
    interval_s: float
    count: int  # per queue


KUEUE_CLASSES = (
    JobClass("small", 1, 0.2, 50, 0.1, 350),
    JobClass("medium", 5, 0.5, 100, 0.5, 100),
    JobClass("large", 20, 1.0, 200, 1.2, 50),
)


@dataclass(frozen=True)
class Config:
    cohorts: int = 5
    queues_per_cohort: int = 6
    nominal: int = 20
    borrowing_limit: int = 100
    node_gpus: int = 120
    """GPUs per node. Kueue's harness counts quota only; big nodes keep placement from
    being the constraint (a large job needs 20 on one node)."""
    classes: tuple[JobClass, ...] = KUEUE_CLASSES
    clients: int = 16
    """Client threads in all, submitting on the arrival schedule."""
    client_procs: int = 2
    """Processes the clients are spread over (0: threads of the server's process)."""
    batch: int = 1
    """Most jobs per request (above 1: ``POST /jobs:batch`` with the jobs already due)."""
    tick_s: float = 0.02
    """The runner's longest sleep between turns (completions are seen on the next turn)."""
    db_url: str | None = None
    tokens: bool = False
    """Burst: clients send an API token from the store (authenticated per request, as
    ``allot up`` does) instead of running without authentication."""
    timeout_s: float = 1_800.0
    loop_process: bool = False
    """Drain: the control loop runs in a process of its own on the same store, woken by
    the API's messages (as ``allot up --scheduler-process`` runs it), instead of a
    thread of the API's process."""
    end_wake: bool = True
    """Drain: each job's end wakes the loop at once (as the local executor's supervisors
    do in ``allot up``); False: its next tick finds the end."""

    @property
    def queues(self) -> list[str]:
        return [f"c{c}-q{q}" for c in range(self.cohorts) for q in range(self.queues_per_cohort)]

    @property
    def capacity(self) -> int:
        return self.cohorts * self.queues_per_cohort * self.nominal

    @property
    def jobs(self) -> int:
        return len(self.queues) * sum(k.count for k in self.classes)

    @property
    def work_bound_s(self) -> float:
        """Total unit-seconds over capacity: no scheduler drains faster."""
        per_queue = sum(k.count * k.units * k.runtime_s for k in self.classes)
        return len(self.queues) * per_queue / self.capacity


def scaled(config: Config, share: float) -> Config:
    """``config`` with every class's job count multiplied by ``share`` (at least 1)."""
    classes = tuple(
        JobClass(
            k.name, k.units, k.runtime_s, k.priority, k.interval_s, max(1, round(k.count * share))
        )
        for k in config.classes
    )
    return Config(**{**config.__dict__, "classes": classes})


def cluster_yaml(config: Config) -> str:
    """The cluster: one pool, cohorts as root queues, their leaves with nominal quota."""
    total = config.capacity
    node_gpus = max(config.node_gpus, max(k.units for k in config.classes))
    nodes = math.ceil(total / node_gpus)
    doc: dict[str, Any] = {
        "priority_classes": [{"name": k.name, "value": k.priority} for k in config.classes],
        "pools": [{"name": POOL}],
        "nodes": [
            {
                "name_prefix": "n-",
                "count": nodes,
                "pool": POOL,
                "capacity": {"gpu": node_gpus, "cpu": 1000, "memory": "4Ti"},
            }
        ],
        "queues": [
            {
                "name": f"c{c}",
                "quota": {POOL: {"gpu": config.nominal * config.queues_per_cohort}},
                "children": [
                    {
                        "name": f"c{c}-q{q}",
                        "quota": {POOL: {"gpu": config.nominal}},
                        "borrowing_limit": {POOL: {"gpu": config.borrowing_limit}},
                        "priority_classes": [k.name for k in config.classes],
                        "default_priority_class": config.classes[0].name,
                        "preemption": {"within_queue": "lower_priority", "reclaim": "any"},
                    }
                    for q in range(config.queues_per_cohort)
                ],
            }
            for c in range(config.cohorts)
        ],
    }
    return json.dumps(doc)  # JSON is YAML


def job_text(queue: str, klass: JobClass, index: int) -> str:
    return json.dumps(
        {
            "name": f"{klass.name}-{index}",
            "queue": queue,
            "type": "batch",
            "priority_class": klass.name,
            "replicas": [{"name": "worker", "resources": {"gpu": klass.units}}],
            "command": ["sleep", str(klass.runtime_s)],
            "env": {RUNTIME_ENV: str(klass.runtime_s)},
        }
    )


@dataclass(frozen=True, order=True)
class Arrival:
    offset_s: float
    queue: str
    klass: str
    text: str = field(compare=False)


def arrivals(config: Config) -> list[Arrival]:
    """Every job with its submission offset, in order: per queue, class ``k``'s ``i``-th
    job at ``i * interval``."""
    out = [
        Arrival(i * k.interval_s, q, k.name, job_text(q, k, i))
        for q in config.queues
        for k in config.classes
        for i in range(k.count)
    ]
    out.sort()
    return out


# ----------------------------------------------------------------------------- system


serve = serve_in_thread


@contextmanager
def store(db_url: str | None) -> Iterator[tuple[sessionmaker[Session], Path]]:
    """A migrated store (SQLite in a temporary directory unless ``db_url``) and a scratch
    directory."""
    with tempfile.TemporaryDirectory(prefix="allotment-kueue-") as tmp:
        url = db_url or f"sqlite:///{Path(tmp) / 'allotment.db'}"
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
            yield session_factory(engine), Path(tmp)
        finally:
            engine.dispose()


# ----------------------------------------------------------------------------- clients

Item = tuple[float, str]
"""A submission: its offset from the start (seconds) and the job file's text."""


@dataclass
class Tally:
    submitted: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _client(
    url: str,
    items: list[Item],
    batch: int,
    ready: Any,
    go: Any,
    start: list[float],
    tally: Tally,
    token: str | None = None,
) -> None:
    """One client: connects, waits for ``go``, then submits ``items`` (sorted by offset)
    when due, up to ``batch`` of the already due ones per request."""
    with AllotmentClient(url, token, timeout=300) as client:
        client.health()  # connected before the clock starts
        ready()
        go()
        t0 = start[0]
        i = 0
        while i < len(items):
            delay = t0 + items[i][0] - time.time()
            if delay > 0:
                time.sleep(delay)
            now = time.time() - t0
            j = i + 1
            while j < len(items) and j - i < batch and items[j][0] <= now:
                j += 1
            texts = [text for _, text in items[i:j]]
            try:
                if batch > 1:
                    client.submit_many(texts)
                else:
                    client.submit(texts[0])
                with tally.lock:
                    tally.submitted += len(texts)
            except Exception as exc:  # counted and reported, not fatal
                with tally.lock:
                    tally.errors.append(f"{type(exc).__name__}: {exc}")
            i = j


def _client_threads(
    url: str,
    items: list[Item],
    threads: int,
    batch: int,
    ready: Callable[[], None],
    go: Callable[[], None],
    start: list[float],
    token: str | None = None,
) -> Tally:
    """``threads`` clients on this process, each with every ``threads``-th item."""
    tally = Tally()
    workers = [
        threading.Thread(
            target=_client,
            args=(url, items[k::threads], batch, ready, go, start, tally, token),
            name=f"bench-client-{k}",
            daemon=True,
        )
        for k in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return tally


def _client_process(
    url: str,
    items: list[Item],
    threads: int,
    batch: int,
    ready: Any,
    go: Any,
    out: Any,
    token: str | None = None,
) -> None:
    """A client process (spawned): ``threads`` clients; puts ``(submitted, errors)``."""
    start = [0.0]

    def wait_go() -> None:
        go.wait()
        start[0] = go.time.value

    tally = _client_threads(url, items, threads, batch, ready.release, wait_go, start, token)
    out.put((tally.submitted, tally.errors[:20], len(tally.errors)))


class _Go:
    """What spawned clients wait on: an event and the start time it carries."""

    def __init__(self, ctx: Any) -> None:
        self.event = ctx.Event()
        self.time = ctx.Value("d", 0.0)

    def wait(self) -> None:
        self.event.wait()

    def set(self, at: float) -> None:
        self.time.value = at
        self.event.set()


def submit_all(
    url: str,
    items: list[Item],
    *,
    procs: int,
    threads: int,
    batch: int,
    lead_s: float = 0.2,
    token: str | None = None,
) -> tuple[int, list[str], float]:
    """Submit ``items`` through the API with ``threads`` clients in all, spread over
    ``procs`` spawned processes (0: threads of this process), ``batch`` jobs per request
    at most. Every client connects first; the clock starts ``lead_s`` later. Returns the
    jobs accepted, the errors and the seconds from the start to the last answer."""
    items = sorted(items, key=lambda item: item[0])
    if procs <= 0:
        ready = threading.Semaphore(0)
        gate = threading.Event()
        start = [0.0]

        def wait_go() -> None:
            gate.wait()

        runner = threading.Thread(
            target=lambda: results.append(
                _client_threads(url, items, threads, batch, ready.release, wait_go, start, token)
            ),
            daemon=True,
        )
        results: list[Tally] = []
        runner.start()
        for _ in range(threads):
            ready.acquire()
        start[0] = time.time() + lead_s
        gate.set()
        runner.join()
        elapsed = time.time() - start[0]
        return results[0].submitted, results[0].errors, elapsed
    ctx = multiprocessing.get_context("spawn")
    ready_sem = ctx.Semaphore(0)
    go = _Go(ctx)
    out = ctx.Queue()
    per = max(1, threads // procs)
    workers = [
        ctx.Process(
            target=_client_process,
            args=(url, items[p::procs], per, batch, ready_sem, go, out, token),
            daemon=True,
        )
        for p in range(procs)
    ]
    for w in workers:
        w.start()
    for _ in range(per * procs):
        ready_sem.acquire()
    at = time.time() + lead_s
    go.set(at)
    submitted = 0
    errors: list[str] = []
    for _ in workers:
        count, errs, _n = out.get()
        submitted += count
        errors.extend(errs)
    elapsed = time.time() - at
    for w in workers:
        w.join()
    return submitted, errors, elapsed


# ----------------------------------------------------------------------------- drain


class ProfiledRunner(LoopRunner):
    """A runner whose thread runs under ``profile`` (cProfile sees one thread only)."""

    def __init__(self, loop: ControlLoop, profile: cProfile.Profile, **kwargs: Any) -> None:
        super().__init__(loop, **kwargs)
        self.profile = profile

    def _run(self) -> None:
        self.profile.enable()
        try:
            super()._run()
        finally:
            self.profile.disable()


@dataclass
class DrainResult:
    config: Config
    jobs: int
    submitted: int
    states: dict[str, int]
    drain_s: float
    submit_span_s: float
    admission_s: dict[str, list[float]]
    preemptions: int
    turns: int
    failed_turns: int
    last_error: str | None
    errors: list[str]

    @property
    def ratio(self) -> float:
        return self.drain_s / self.config.work_bound_s


def _finished(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as db:
        rows = db.execute(select(Job.state, func.count()).group_by(Job.state)).tuples()
        return dict(rows.all())


TERMINAL = {
    JobState.SUCCEEDED.value,
    JobState.FAILED.value,
    JobState.CANCELLED.value,
    JobState.RECLAIMED.value,
}


def _timed_loop(cluster: Cluster, sessions: sessionmaker[Session], work: Path) -> ControlLoop:
    return ControlLoop(
        cluster, sessions, TimedExecutor(clock=time.time), work_root=work, clock=time.time
    )


@dataclass
class LoopTally:
    """What a runner reports of its turns (a thread's, or a loop process's)."""

    turns: int = 0
    failures: int = 0
    last_error: str | None = None


def _loop_process(url: str, config: Config, work: str, stop: Any, out: Any) -> None:
    """A loop process: the control loop on the store at ``url``, woken by ``wake``
    messages (its port and secret are put on ``out`` first), until ``stop`` is set;
    then puts its :class:`LoopTally` on ``out``."""
    engine = make_engine(url)
    try:
        cluster = load_cluster_text(cluster_yaml(config), source="bench")
        loop = _timed_loop(cluster, session_factory(engine), Path(work))
        runner = LoopRunner(loop, tick_s=config.tick_s)
        listener = WakeListener(lambda kind, _: runner.wake() if kind == "wake" else None)
        listener.start()
        if config.end_wake:
            loop.executor.wake_on_end(listener.port, listener.secret)
        runner.start()
        out.put((listener.port, listener.secret))
        stop.wait()
        runner.stop()
        listener.stop()
        out.put(LoopTally(runner.turns, runner.failures, runner.last_error))
    finally:
        engine.dispose()


@contextmanager
def _loop_elsewhere(config: Config, url: str, work: Path) -> Iterator[tuple[LoopTally, WakeSender]]:
    """The loop in a process of its own while the block runs, and what wakes it; the
    tally is filled after."""
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_loop_process, args=(url, config, str(work), stop, out))
    proc.start()
    tally = LoopTally()
    port, secret = out.get(timeout=60)
    sender = WakeSender(port, secret)
    try:
        yield tally, sender
    finally:
        sender.close()
        stop.set()
        try:
            found = out.get(timeout=60)
            tally.turns, tally.failures, tally.last_error = (
                found.turns,
                found.failures,
                found.last_error,
            )
        finally:
            proc.join(timeout=30)


def run_drain(config: Config, *, profile: cProfile.Profile | None = None) -> DrainResult:
    """Submit every job on its schedule through the API and wait until all have ended."""
    cluster: Cluster = load_cluster_text(cluster_yaml(config), source="bench")
    schedule = arrivals(config)
    with store(config.db_url) as (sessions, tmp), ExitStack() as stack:
        runner: LoopRunner | LoopTally
        wake: Callable[[], None] | None = None
        if config.loop_process:
            db_url = config.db_url or f"sqlite:///{tmp / 'allotment.db'}"
            runner, sender = stack.enter_context(_loop_elsewhere(config, db_url, tmp / "work"))
            wake = sender.wake
        else:
            loop = _timed_loop(cluster, sessions, tmp / "work")
            runner = (
                LoopRunner(loop, tick_s=config.tick_s)
                if profile is None
                else ProfiledRunner(loop, profile, tick_s=config.tick_s)
            )
            runner.start()
            stack.callback(runner.stop)
            wake = runner.wake
            if config.end_wake:
                ends = WakeListener(lambda kind, _: runner.wake() if kind == "wake" else None)
                ends.start()
                stack.callback(ends.stop)
                loop.executor.wake_on_end(ends.port, ends.secret)
        app = create_app(
            cluster=cluster, store_sessions=sessions, clock=time.time, after_write=wake
        )
        with serve(app) as url:
            submitted, errors, _ = submit_all(
                url,
                [(a.offset_s, a.text) for a in schedule],
                procs=config.client_procs,
                threads=config.clients,
                batch=config.batch,
            )
            deadline = time.monotonic() + config.timeout_s
            while True:
                states = _finished(sessions)
                done = sum(n for s, n in states.items() if s in TERMINAL)
                if done >= submitted or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        stack.close()  # the loop stops (its tally is in) before the figures are read
        return _drain_result(config, sessions, states, submitted, runner, errors)


def _drain_result(
    config: Config,
    sessions: sessionmaker[Session],
    states: dict[str, int],
    submitted: int,
    runner: LoopRunner | LoopTally,
    errors: list[str],
) -> DrainResult:
    with sessions() as db:
        jobs = {
            job_id: (klass, submit)
            for job_id, klass, submit in db.execute(
                select(Job.id, Job.priority_class, Job.submit_time)
            ).tuples()
        }
        moves = db.execute(
            select(Event.job_id, Event.to_state, Event.at)
            .where(
                Event.to_state.in_(
                    [JobState.ADMITTED.value, JobState.SUCCEEDED.value, JobState.PREEMPTED.value]
                )
            )
            .order_by(Event.id)
        ).tuples()
        admitted: dict[str, float] = {}
        last_end = 0.0
        preemptions = 0
        for job_id, to_state, at in moves:
            if to_state == JobState.ADMITTED.value:
                if job_id is not None:
                    admitted.setdefault(job_id, at)
            elif to_state == JobState.SUCCEEDED.value:
                last_end = max(last_end, at)
            else:
                preemptions += 1
    first = min((s for _, s in jobs.values()), default=0.0)
    last_submit = max((s for _, s in jobs.values()), default=0.0)
    waits: dict[str, list[float]] = {k.name: [] for k in config.classes}
    for job_id, (klass, submit) in jobs.items():
        if job_id in admitted:
            waits.setdefault(klass, []).append(admitted[job_id] - submit)
    return DrainResult(
        config=config,
        jobs=config.jobs,
        submitted=submitted,
        states=states,
        drain_s=max(0.0, last_end - first),
        submit_span_s=last_submit - first,
        admission_s=waits,
        preemptions=preemptions,
        turns=runner.turns,
        failed_turns=runner.failures,
        last_error=runner.last_error,
        errors=errors,
    )


# ----------------------------------------------------------------------------- burst


def run_burst(config: Config, *, clients: int, jobs: int) -> float:
    """Submissions per second: ``clients`` clients (spread over ``config.client_procs``
    processes) submit ``jobs`` jobs in all, as fast as they can, ``config.batch`` per
    request, with no control loop running. Every submission must be stored."""
    cluster = load_cluster_text(cluster_yaml(config), source="bench")
    texts = [job_text(q, k, i) for i, (q, k) in enumerate(_cycle(config, jobs))]
    with store(config.db_url) as (sessions, _tmp):
        token, authenticator = _token(sessions) if config.tokens else (None, None)
        app = create_app(
            cluster=cluster, store_sessions=sessions, clock=time.time, authenticator=authenticator
        )
        with serve(app) as url:
            submitted, errors, elapsed = submit_all(
                url,
                [(0.0, text) for text in texts],
                procs=config.client_procs,
                threads=clients,
                batch=config.batch,
                token=token,
            )
        check_stored(sessions, jobs=jobs, submitted=submitted, errors=errors)
    return jobs / elapsed


def check_stored(
    sessions: sessionmaker[Session], *, jobs: int, submitted: int, errors: list[str]
) -> None:
    """Raise unless every one of ``jobs`` submissions was accepted and stored."""
    if errors:
        raise RuntimeError(f"{len(errors)} submissions failed, first: {errors[0]}")
    with sessions() as db:
        stored = db.scalar(select(func.count()).select_from(Job))
    if stored != jobs or submitted != jobs:
        raise RuntimeError(f"{jobs} to submit, {submitted} accepted, {stored} stored")


def _token(sessions: sessionmaker[Session]) -> tuple[str, StoreTokens]:
    """A platform admin's API token in the store, and the authenticator ``allot up``
    uses for such tokens."""
    token = new_token()
    with sessions.begin() as db:
        create_token(
            db,
            digest=token_digest(token),
            user="bench",
            tenant=None,
            role="admin",
            created_by="bench",
            at=time.time(),
            expires_at=None,
        )
    return token, StoreTokens(sessions, clock=time.time)


def _cycle(config: Config, n: int) -> Iterator[tuple[str, JobClass]]:
    queues = config.queues
    for i in range(n):
        yield queues[i % len(queues)], config.classes[i % len(config.classes)]


# ----------------------------------------------------------------------------- report


def _pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def report_drain(r: DrainResult, out: Callable[[str], None] = print) -> None:
    c = r.config
    out(
        f"drain: {c.cohorts} cohorts x {c.queues_per_cohort} queues, {r.jobs} jobs, "
        f"capacity {c.capacity}, work bound {c.work_bound_s:.1f} s, {c.clients} clients "
        f"in {c.client_procs or 'the server'} process(es), batch {c.batch}, tick {c.tick_s} s, "
        f"loop in {'a process of its own' if c.loop_process else 'a thread of the API'}, "
        f"{'ends told at once' if c.end_wake else 'ends found at the tick'}"
    )
    out(f"  submitted {r.submitted}, states {dict(sorted(r.states.items()))}")
    out(f"  submissions spanned {r.submit_span_s:.1f} s")
    out(
        f"  drain {r.drain_s:.1f} s = {r.ratio:.3f} x bound "
        f"(Kueue's mean on the full baseline: {KUEUE_MEAN_DRAIN_S:.0f} s)"
    )
    out(f"  preemptions {r.preemptions}; loop turns {r.turns} ({r.failed_turns} failed)")
    out(f"  {'class':<8} {'n':>6} {'mean s':>8} {'p50 s':>8} {'p99 s':>8} {'max s':>8}")
    for name, waits in r.admission_s.items():
        mean = statistics.fmean(waits) if waits else math.nan
        out(
            f"  {name:<8} {len(waits):>6} {mean:>8.3f} {_pct(waits, 50):>8.3f} "
            f"{_pct(waits, 99):>8.3f} {max(waits, default=math.nan):>8.3f}"
        )
    if r.errors:
        out(f"  {len(r.errors)} submission errors, first: {r.errors[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("drain", "burst", "both"), default="both")
    parser.add_argument(
        "--quick", action="store_true", help="1 cohort, 10%% of the jobs, short bursts"
    )
    parser.add_argument("--share", type=float, default=1.0, help="share of each class's jobs")
    parser.add_argument("--cohorts", type=int, default=5)
    parser.add_argument("--clients", type=int, default=16, help="client threads (drain)")
    parser.add_argument(
        "--client-procs",
        type=int,
        default=2,
        help="processes the clients are spread over (0: threads of the server's process)",
    )
    parser.add_argument(
        "--batch", type=int, default=1, help="jobs per request (>1: POST /jobs:batch)"
    )
    parser.add_argument("--tick", type=float, default=0.02, help="runner tick, seconds")
    parser.add_argument(
        "--loop-process",
        action="store_true",
        help="drain: run the control loop in a process of its own on the same store",
    )
    parser.add_argument(
        "--no-end-wake",
        action="store_true",
        help="drain: a job's end is found at the loop's next tick, not told at once",
    )
    parser.add_argument("--node-gpus", type=int, default=120)
    parser.add_argument("--db", default=None, help="database URL (default: temporary SQLite)")
    parser.add_argument(
        "--burst-clients", default="8,16,32", help="comma-separated concurrency levels"
    )
    parser.add_argument("--burst-jobs", type=int, default=3_000)
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="burst: clients authenticate with an API token from the store",
    )
    parser.add_argument("--repeat", type=int, default=3, help="burst runs per level")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the control loop's thread (drain)"
    )
    parser.add_argument("--profile-out", default=None)
    args = parser.parse_args(argv)

    config = Config(
        cohorts=1 if args.quick else args.cohorts,
        clients=args.clients,
        client_procs=args.client_procs,
        batch=args.batch,
        tick_s=args.tick,
        node_gpus=args.node_gpus,
        db_url=args.db,
        tokens=args.tokens,
        loop_process=args.loop_process,
        end_wake=not args.no_end_wake,
    )
    share = 0.1 if args.quick else args.share
    if share != 1.0:
        config = scaled(config, share)
    burst_jobs = 500 if args.quick else args.burst_jobs
    repeat = 1 if args.quick else args.repeat

    status = 0
    if args.mode in ("drain", "both"):
        profile = cProfile.Profile() if args.profile else None
        result = run_drain(config, profile=profile)
        report_drain(result)
        if result.errors or result.states.get(JobState.SUCCEEDED.value, 0) != result.jobs:
            status = 1
        if profile is not None:
            if args.profile_out:
                profile.dump_stats(args.profile_out)
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
            print(text.getvalue())
    if args.mode in ("burst", "both"):
        print(
            f"burst: {burst_jobs} submissions per run, {repeat} runs per level, no loop, "
            f"clients in {config.client_procs or 'the server'} process(es), batch {config.batch}"
        )
        print(f"  {'clients':>7} {'median/s':>9}  runs/s")
        for level in (int(x) for x in args.burst_clients.split(",")):
            rates = [run_burst(config, clients=level, jobs=burst_jobs) for _ in range(repeat)]
            runs = ", ".join(f"{r:.0f}" for r in rates)
            print(f"  {level:>7} {statistics.median(rates):>9.0f}  {runs}")
    return status


if __name__ == "__main__":
    sys.exit(main())
