"""Submissions a second through N API processes (``allot up --api-processes N``).

Not a test. For each N given, a fresh store (SQLite, or with ``--db`` a database of its
own on a PostgreSQL server) gets the Kueue baseline's cluster (see
bench_kueue.py), then uvicorn serves the API from N processes built exactly as
``allot up --api-processes N`` builds them (:mod:`allotment.api_processes`: shared
counters, messages to a server, the same app), in a child process that plays the
server; no control loop runs. Clients (``--clients`` threads over ``--client-procs``
processes) submit ``--jobs`` jobs, one request each, as fast as they can, with the
server's admin token; every submission must be stored. Prints the rate per N and run,
and the median.

    PYTHONPATH=src:. python bench/bench_api_processes.py --processes 1,2 --repeat 3

The clients share the machine with the server: on a machine with few cores their own
work bounds the rate (see the README).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from bench.bench_kueue import (
    Config,
    _cycle,
    check_stored,
    cluster_yaml,
    job_text,
    submit_all,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from allotment.api.auth import new_token, token_digest
from allotment.api.serving import free_port
from allotment.api_processes import SETTINGS_ENV, ApiProcessSettings
from allotment.control.wake import WakeListener
from allotment.store import migrate
from allotment.store.configs import apply_cluster_config
from allotment.store.db import make_engine, session_factory

SERVER = """
import os, sys, uvicorn
from pathlib import Path
from allotment.api_processes import ApiProcessSettings, SETTINGS_ENV
path = Path(os.environ[SETTINGS_ENV])
settings = ApiProcessSettings.read(path)
workers = int(sys.argv[1])
server = os.getpid() if workers > 1 else os.getppid()  # one: the app runs here
settings = ApiProcessSettings(**{**settings.__dict__, "server_pid": server})
settings.write()
uvicorn.run("allotment.api_processes:app_from_environment", factory=True,
            workers=workers, port=int(sys.argv[2]), host="127.0.0.1",
            log_level="warning", access_log=False)
"""
"""Plays the server: writes its own pid into the settings, then runs uvicorn's
supervisor with N API processes (uvicorn needs N >= 2 for its supervisor; N = 1 is
served by one such process all the same)."""


@contextmanager
def fresh_database(server: str | None, data: Path) -> Iterator[str]:
    """A SQLite file in ``data``, or (``server``: a PostgreSQL URL) a database of its own
    on that server, dropped afterwards."""
    if server is None:
        yield f"sqlite:///{data / 'allotment.db'}"
        return
    name = f"allot_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(server).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def run(
    processes: int, *, jobs: int, clients: int, client_procs: int, db: str | None = None
) -> float:
    config = Config()
    texts = [job_text(q, k, i) for i, (q, k) in enumerate(_cycle(config, jobs))]
    token = new_token()
    messages = WakeListener(lambda kind, words: None)  # the server's relay, deaf here
    messages.start()
    with (
        tempfile.TemporaryDirectory(prefix="allotment-api-") as tmp,
        fresh_database(db, Path(tmp)) as url,
    ):
        data = Path(tmp)
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
            sessions = session_factory(engine)
            with sessions.begin() as db:
                apply_cluster_config(db, cluster_yaml(config), at=time.time(), applied_by="bench")
            path = ApiProcessSettings(
                data_dir=data,
                database_url=url,
                admin_digest=token_digest(token),
                admin_user="bench",
                relay_port=messages.port,
                relay_secret=messages.secret,
                per_second=None,
                burst=1,
                reconcile_every_s=30.0,
                server_pid=0,  # the server writes its own
            ).write()
            port = free_port()
            server = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(processes), str(port)],
                env={**os.environ, SETTINGS_ENV: str(path)},
            )
            try:
                url = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if httpx.get(f"{url}/api/v1/healthz", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("the API processes did not start")
                    time.sleep(0.1)
                time.sleep(2.0)  # every process has its app
                submitted, errors, elapsed = submit_all(
                    url,
                    [(0.0, text) for text in texts],
                    procs=client_procs,
                    threads=clients,
                    batch=1,
                    token=token,
                )
            finally:
                server.terminate()
                server.wait(timeout=30)
            check_stored(sessions, jobs=jobs, submitted=submitted, errors=errors)
        finally:
            engine.dispose()
            messages.stop()
    return jobs / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="1,2", help="comma-separated API process counts")
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--db", default=None, help="a PostgreSQL server's URL: a fresh database per run"
    )
    args = parser.parse_args(argv)
    levels = [int(n) for n in args.processes.split(",")]
    print(
        f"api processes: {args.jobs} submissions per run, {args.clients} clients in "
        f"{args.client_procs} process(es), {os.cpu_count()} cores, "
        f"{'PostgreSQL' if args.db else 'SQLite'}"
    )
    print(f"  {'processes':>9}  {'median/s':>8}  runs/s")
    for n in levels:
        rates = [
            run(
                n,
                jobs=args.jobs,
                clients=args.clients,
                client_procs=args.client_procs,
                db=args.db,
            )
            for _ in range(args.repeat)
        ]
        runs = " ".join(f"{r:.0f}" for r in rates)
        print(f"  {n:>9}  {statistics.median(rates):>8.0f}  {runs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
