"""``allot up`` deployments for the reliability campaigns.

One or two real servers (``python -m allotment.cli.main up``) on one store and one data
directory, each on its own port of 127.0.0.1, killed and started again at will. The
cluster has one node of four virtual GPUs and one queue that retries a job lost with its
node once. :meth:`Deployment.close` kills the servers and every process their executor
started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from allotment.api.serving import free_port
from allotment.client import AllotmentClient
from allotment.clientconfig import read_client_config
from allotment.executors.supervisor import read_json

GPUS = 4
CLUSTER = f"""\
pools:
  - {{name: local, labels: {{gpu_model: virtual}}}}
nodes:
  - {{name: localhost, pool: local, capacity: {{gpu: {GPUS}, cpu: 16, memory: 32Gi}}}}
queues:
  - name: default
    quota: {{local: {{gpu: {GPUS}, cpu: 16, memory: 32Gi}}}}
    default_priority_class: training
    retry: {{max_attempts: 2, on: [node_failure], backoff: 1s}}
"""

POSTGRES_URL = os.environ.get(
    "ALLOTMENT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@dataclass
class Deployment:
    """Servers numbered from 0 on one store (``db_url``; None: SQLite in the data
    directory) and one data directory under ``root``."""

    root: Path
    db_url: str | None = None
    servers: int = 1
    ports: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = self.ports or [free_port() for _ in range(self.servers)]
        self.cluster_file.write_text(CLUSTER)
        self.records.mkdir(exist_ok=True)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.yaml"

    @property
    def records(self) -> Path:
        """Where the campaign's jobs write what they ran (see ``runs.RECORDER``)."""
        return self.root / "records"

    @property
    def executor_dir(self) -> Path:
        return self.data_dir / "executor"

    def url(self, server: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[server]}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["XDG_CONFIG_HOME"] = str(self.root / "config")
        env.pop("ALLOT_URL", None)
        env.pop("ALLOT_TOKEN", None)
        return env

    def start(self, server: int = 0, *, timeout: float = 60.0) -> None:
        """Start server ``server`` and wait until it answers."""
        command = [
            sys.executable,
            "-m",
            "allotment.cli.main",
            "up",
            "-f",
            str(self.cluster_file),
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.ports[server]),
            "--tick",
            "0.2",
            "--stop-grace",
            "1",
            "--reconcile-every",
            "1",
        ]
        if self.db_url is not None:
            command += ["--db", self.db_url]
        with (self.root / f"server-{server}.log").open("ab") as log:
            process = subprocess.Popen(
                command, env=self._env(), stdout=subprocess.DEVNULL, stderr=log
            )
        self.processes[server] = process
        self.started.append(process)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"allot up exited {process.returncode}: see {log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url(server)}/api/v1/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"allot up on port {self.ports[server]} did not answer in time")

    def kill(self, server: int = 0) -> None:
        """SIGKILL server ``server`` (its replicas run on) and reap it."""
        process = self.processes.pop(server)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def alive(self, server: int = 0) -> bool:
        process = self.processes.get(server)
        return process is not None and process.poll() is None

    def token(self) -> str:
        token = read_client_config(self.root / "config" / "allotment" / "config.json")["token"]
        return str(token)

    def client(self, server: int = 0, *, timeout: float = 5.0) -> AllotmentClient:
        return AllotmentClient(self.url(server), self.token(), timeout=timeout)

    def supervisors(self) -> list[int]:
        """The process ids of the supervisors of replicas that have not ended."""
        pids = []
        for launch in self.executor_dir.glob("*/*/*/launch.json"):
            state = read_json(launch.with_name("state.json")) or {}
            if state.get("ended_at") is not None:
                continue
            pid = (read_json(launch) or {}).get("supervisor_pid")
            if isinstance(pid, int):
                pids.append(pid)
        return pids

    def leaderships(self) -> int:
        """How many times a server of this deployment took the lead (from its log)."""
        return sum(
            path.read_text(errors="replace").count("this server now runs the scheduler")
            for path in self.root.glob("server-*.log")
        )

    def close(self) -> None:
        """Kill every server and every supervisor and replica group they started."""
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
        self.processes.clear()
        kill_replicas(self.executor_dir)


def kill_replicas(root: Path) -> None:
    """SIGKILL every supervisor (its own group) and replica group under ``root``."""
    for name in ("launch.json", "state.json"):
        for path in root.glob(f"*/*/*/{name}"):
            data = read_json(path) or {}
            for key in ("supervisor_pid", "pgid"):
                pgid = data.get(key)
                if isinstance(pgid, int):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def postgres_database(base_url: str = POSTGRES_URL) -> Iterator[str]:
    """A new, empty PostgreSQL database on the server of ``base_url``; its URL, dropped
    (connections and all) afterwards."""
    name = f"allot_campaign_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def terminate_leader_connection(db_url: str) -> bool:
    """Terminate the connection that holds the leader's advisory lock on ``db_url``'s
    database (as an operator's ``pg_terminate_backend`` or a network cut would); whether
    there was one."""
    engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            holders = connection.execute(
                text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND database = (SELECT oid FROM pg_database WHERE datname = "
                    "current_database())"
                )
            ).scalars()
            killed = False
            for pid in list(holders):
                connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                killed = True
            return killed
    finally:
        engine.dispose()
