"""What one ``POST /api/v1/jobs`` costs the server, in CPU, phase by phase.

Not a test. The app is built as ``allot up`` builds it (an API token from the store,
audit trail, rate limit, a hook after each write) and served by uvicorn on 127.0.0.1 in
a thread of this process; the clients run in spawned processes, so the CPU this process
spends (all its threads) is the server's. The workload is bench_kueue's (its cluster
and job files).

It prints the server's CPU per request and the rate. With ``--profile`` each phase is
timed with the CPU clock of the thread it runs on (its own time, without the phases it
calls), and what no phase claims is shown as the rest (uvicorn, routing, FastAPI's
handler and thread hand-offs). Phases on the event loop are only exact with one request
in flight: ``--profile`` defaults to one client.

Run ``python bench/bench_submit.py --help``; see bench/README.md.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.bench_kueue import Config, _cycle, _token, cluster_yaml, job_text, store, submit_all

from allotment.api.app import create_app
from allotment.api.ratelimit import RateLimit
from allotment.api.serving import serve_in_thread
from allotment.domain.loading import load_cluster_text

UNLIMITED = RateLimit(per_second=1e9, burst=10**9)
"""The rate limiter runs (its cost counts) but never refuses."""


class Phases:
    """Own CPU time per phase, on whichever thread each runs."""

    def __init__(self) -> None:
        self.own: defaultdict[str, float] = defaultdict(float)
        self.calls: defaultdict[str, int] = defaultdict(int)
        self._local = threading.local()
        self._undo: list[Callable[[], None]] = []

    def _stack(self) -> list[float]:
        stack: list[float] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _enter(self) -> float:
        self._stack().append(0.0)
        return time.thread_time()

    def _leave(self, name: str, t0: float) -> None:
        spent = time.thread_time() - t0
        stack = self._stack()
        inner = stack.pop()
        self.own[name] += spent - inner
        self.calls[name] += 1
        if stack:
            stack[-1] += spent

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        """Time ``owner.attr`` (a function, method or coroutine function) as ``name``."""
        original = inspect.getattr_static(owner, attr)
        fn = original.__func__ if isinstance(original, staticmethod) else original
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                t0 = self._enter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self._leave(name, t0)

            wrapped: Any = timed_async
        else:

            @functools.wraps(fn)
            def timed(*args: Any, **kwargs: Any) -> Any:
                t0 = self._enter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._leave(name, t0)

            wrapped = timed
        if isinstance(original, staticmethod):
            wrapped = staticmethod(wrapped)
        setattr(owner, attr, wrapped)
        self._undo.append(lambda: setattr(owner, attr, original))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def _maybe(phases: Phases, module: str, attr: str, name: str) -> None:
    """Wrap ``module``'s ``attr`` (``Class.method`` allowed) when it exists."""
    try:
        owner: Any = __import__(module, fromlist=["_"])
        *path, last = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        getattr(owner, last)
    except (ImportError, AttributeError):
        return
    phases.wrap(owner, last, name)


PHASES: tuple[tuple[str, str, str], ...] = (
    ("allotment.api.ratelimit", "RateLimiter.__call__", "rate limit"),
    ("allotment.api.audit", "AuditTrail.__call__", "audit: middleware"),
    ("allotment.api.audit", "AuditTrail._record", "audit: middleware"),
    ("allotment.api.audit", "AuditTrail._append", "audit: record write"),
    ("allotment.store.audit", "append", "audit: record insert"),
    ("allotment.api.limits", "RefuseNul.__call__", "other middleware"),
    ("allotment.api.limits", "BodyLimit.__call__", "other middleware"),
    ("allotment.api.gate", "AfterWrite.__call__", "other middleware"),
    ("starlette.middleware.errors", "ServerErrorMiddleware.__call__", "Starlette: app, routing"),
    ("starlette.middleware.exceptions", "ExceptionMiddleware.__call__", "Starlette: app, routing"),
    (
        "fastapi.middleware.asyncexitstack",
        "AsyncExitStackMiddleware.__call__",
        "Starlette: app, routing",
    ),
    ("fastapi.telemetry._asgi", "ExceptionTelemetryMiddleware.__call__", "Starlette: app, routing"),
    ("fastapi._body_limit", "AppBodyLimitMiddleware.__call__", "Starlette: app, routing"),
    ("starlette.applications", "Starlette.__call__", "Starlette: app, routing"),
    ("starlette.routing", "Router.__call__", "Starlette: app, routing"),
    ("fastapi.routing", "APIRoute.handle", "FastAPI: request handler"),
    ("starlette.requests", "Request.body", "body: read"),
    ("starlette.requests", "Request.json", "body: JSON"),
    ("fastapi.routing", "solve_dependencies", "FastAPI: dependencies, body model"),
    ("allotment.api.access", "authenticate", "auth"),
    ("allotment.api.access", "presented_token", "auth"),
    ("allotment.api.access", "authenticate_now", "auth"),
    ("allotment.api.service", "JobService.submit", "submit: service"),
    ("allotment.api.service", "JobService._once", "submit: service"),
    ("allotment.domain.loading", "parse_spec", "spec: parse text"),
    ("allotment.domain.loading", "_spec_data", "spec: parse text"),
    ("allotment.domain.loading", "validate_model", "spec: JobSpec model"),
    ("allotment.api.service", "JobService.check_spec", "spec: cluster checks"),
    ("allotment.api.service", "JobService._job", "spec: cluster checks"),
    ("allotment.api.service", "JobService._check_fits", "spec: cluster checks"),
    ("allotment.api.service", "check_data_scopes", "spec: cluster checks"),
    ("allotment.api.service", "check_execution", "spec: cluster checks"),
    ("allotment.store.jobs", "create_job", "store: job insert"),
    ("allotment.store.jobs", "insert_job", "store: job insert"),
    ("allotment.store.idempotency", "find", "store: idempotency key"),
    ("allotment.store.idempotency", "earlier", "store: idempotency key"),
    ("allotment.store.idempotency", "record", "store: idempotency key"),
    ("allotment.store.batching", "GroupCommit._write", "store: transaction, commit"),
    ("allotment.store.batching", "GroupCommit._alone", "store: transaction, commit"),
    ("allotment.api.service", "job_out", "response: JobOut"),
    ("fastapi.routing", "serialize_response", "response: FastAPI serialise"),
)


@contextmanager
def timed_phases(enabled: bool) -> Iterator[Phases]:
    phases = Phases()
    if enabled:
        for module, attr, name in PHASES:
            _maybe(phases, module, attr, name)
    try:
        yield phases
    finally:
        phases.undo()


def run(
    config: Config, *, clients: int, jobs: int, profile: bool
) -> tuple[float, float, dict[str, float]]:
    """One run: ``(requests per second, server CPU ms per request, phase ms per
    request)``."""
    cluster = load_cluster_text(cluster_yaml(config), source="bench")
    queues = _cycle(config, jobs)
    texts = [job_text(q, k, i) for i, (q, k) in enumerate(queues)]
    writes = [0]
    with store(config.db_url) as (sessions, _tmp), timed_phases(profile) as phases:
        token, authenticator = _token(sessions)

        def after_write() -> None:
            writes[0] += 1

        app = create_app(
            cluster=cluster,
            store_sessions=sessions,
            clock=time.time,
            authenticator=authenticator,
            after_write=after_write,
            rate_limit=UNLIMITED,
        )
        with serve_in_thread(app) as url:
            cpu0 = time.process_time()
            submitted, errors, elapsed = submit_all(
                url,
                [(0.0, text) for text in texts],
                procs=config.client_procs,
                threads=clients,
                batch=1,
                token=token,
            )
            cpu = time.process_time() - cpu0
        if errors or submitted != jobs or writes[0] != jobs:
            raise RuntimeError(f"{len(errors)} errors, {submitted} of {jobs}: {errors[:1]}")
        per = {name: 1000 * s / jobs for name, s in phases.own.items()}
    return jobs / elapsed, 1000 * cpu / jobs, per


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2_000, help="submissions per run")
    parser.add_argument("--clients", type=int, default=None, help="16; 1 with --profile")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cohorts", type=int, default=5)
    parser.add_argument("--db", default=None, help="database URL (default: temporary SQLite)")
    parser.add_argument("--profile", action="store_true", help="time each phase")
    args = parser.parse_args(argv)
    clients = args.clients or (1 if args.profile else 16)
    config = Config(
        cohorts=args.cohorts, client_procs=min(args.client_procs, clients), db_url=args.db
    )
    runs = [
        run(config, clients=clients, jobs=args.jobs, profile=args.profile)
        for _ in range(args.repeat)
    ]
    rates = [r[0] for r in runs]
    cpus = [r[1] for r in runs]
    print(
        f"submit: {args.jobs} POST /jobs per run, {clients} clients in "
        f"{config.client_procs} process(es), {args.repeat} runs"
    )
    print(f"  rate/s      median {statistics.median(rates):7.0f}   runs {_list(rates, '.0f')}")
    print(f"  server CPU  median {statistics.median(cpus):7.3f} ms/request   runs {_list(cpus)}")
    if args.profile:
        names = sorted({n for r in runs for n in r[2]}, key=lambda n: -runs[0][2].get(n, 0))
        print(f"  {'phase (own CPU, ms/request, median)':<40} {'ms':>7}")
        claimed = 0.0
        for name in names:
            ms = statistics.median(r[2].get(name, 0.0) for r in runs)
            claimed += ms
            print(f"  {name:<40} {ms:>7.3f}")
        rest = statistics.median(cpus) - claimed
        print(f"  {'rest: uvicorn, routing, handler, threads':<40} {rest:>7.3f}")
    return 0


def _list(values: list[float], fmt: str = ".3f") -> str:
    return ", ".join(format(v, fmt) for v in values)


if __name__ == "__main__":
    sys.exit(main())
