"""The composition root: what ``allot up`` starts.

The store (SQLite file in the data directory by default, or ``--db``), migrated to the
newest schema; the cluster configuration (``-f`` applied first; else the one stored;
else a one-node cluster describing this machine); the local executor; the scheduler's
side (:mod:`allotment.host`: the leader election and, while leading, the control loop on
a thread of its own, with the ``max_wait`` check as a step of each turn, the upkeep and
the service controller beside it), woken by every write through the API -- in this
process, or with ``scheduler_process`` in a process of its own on the same store, woken
by messages; the webhook deliveries of alerts on a thread of their own (on every server:
they claim rows with a lease); and the HTTP API with the dashboard, ``/metrics`` and the
proxy to services and notebooks, served by uvicorn -- in this process, or with
``api_processes`` above 1 in that many processes of its own on the one port
(:mod:`allotment.api_processes`).

It writes the local user's client configuration (server URL and an admin token) so that
the CLI works at once; only the token's digest is kept on the server side. That token
is a platform admin named after the local OS user; the API tokens issued through
``/api/v1/tokens`` are accepted as well (:mod:`allotment.api.auth`). Replicas run
under supervisors of their own and outlive the server: a restarted server re-adopts
them at its first turn.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.auth import StoreTokens, token_digest
from allotment.api.ratelimit import SERVER_DEFAULT, RateLimit
from allotment.api_processes import (
    COUNTERS_FILE,
    SETTINGS_ENV,
    ApiProcessSettings,
    Relay,
    SharedCounters,
    StoredClusterState,
    api_app,
    stored_cluster,
)
from allotment.clientconfig import read_client_config, write_client_config
from allotment.control.cluster_state import ClusterState
from allotment.control.loop import DEFAULT_STOP_GRACE_S
from allotment.control.runner import DEFAULT_RECONCILE_EVERY_S, DEFAULT_TICK_S
from allotment.control.services import ServiceTraffic
from allotment.domain.cluster import Cluster
from allotment.domain.errors import InvalidInput
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import Executor
from allotment.executors.gpus import nvml_gpus
from allotment.host import (
    ExecutorNotReady,
    HostSettings,
    SchedulerHost,
    SchedulerNotStarted,
    SchedulerProcess,
    make_executor,
)
from allotment.store import migrate
from allotment.store.configs import apply_cluster_config, current_cluster_config
from allotment.store.db import make_engine, session_factory
from allotment.upkeep import server_upkeep
from allotment.upkeep.webhooks import WebhookDeliveries

log = logging.getLogger("allotment.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8642
VIRTUAL_GPUS = 2
"""GPUs of the built-in local cluster on a machine where NVML finds none."""
TOKEN_DIGEST_FILE = "admin-token.sha256"


def local_user() -> str:
    """The OS user running ``allot up``: the platform admin its token speaks for."""
    try:
        return getpass.getuser() or "admin"
    except (OSError, KeyError, ImportError):
        return "admin"


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "allotment"


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    data_dir: Path
    db_url: str | None = None
    """None: ``sqlite:///<data_dir>/allotment.db``."""
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    cluster_file: Path | None = None
    client_config: Path | None = None
    """Where to write the CLI's config; None: the user's default place."""
    tick_s: float = DEFAULT_TICK_S
    reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    rate_limit: RateLimit | None = SERVER_DEFAULT
    """Requests per API token; None: unlimited."""
    trusted_proxies: tuple[str, ...] = ()
    """Reverse proxies whose ``X-Forwarded-For`` names the client (for the audit trail
    and the rate limit); empty: the header is never believed."""
    scheduler_process: bool = False
    """Run the scheduler's side (leader election, control loop, upkeep, service
    controller) in a process of its own, off the API's interpreter lock (``allot up``
    does unless told otherwise where :func:`spare_core` says so)."""
    api_processes: int = 1
    """Processes serving the API on the one port (see :mod:`allotment.api_processes`);
    1: this process serves it."""

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.data_dir / 'allotment.db'}"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def spare_core() -> bool:
    """Whether this process may run on two cores or more: then ``allot up`` puts the
    scheduler in a process of its own by default (on one core it would only add one)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return cores >= 2


class StartupError(Exception):
    """``allot up`` cannot start; the message says what to change."""


def local_cluster_text(gpus: int, cpus: int, memory_gib: int, *, virtual: bool) -> str:
    """A one-node cluster for this machine: queues ``default`` and ``batch``, each
    guaranteed half of it and free to borrow the rest."""
    half_gpu = gpus // 2
    model = "virtual" if virtual else "nvml"
    return f"""# Written by 'allot up' for this machine; replace it with 'allot apply -f FILE'.
pools:
  - name: local
    labels: {{gpu_model: {model}}}
    price_per_gpu_hour: 0
nodes:
  - {{name: localhost, pool: local, capacity: {{gpu: {gpus}, cpu: {cpus}, memory: {memory_gib}Gi}}}}
tenants:
  - name: local
queues:
  - name: workstation
    children:
      - name: default
        tenant: local
        quota: {{local: {{gpu: {gpus - half_gpu}, cpu: {cpus - cpus // 2}}}}}
        default_priority_class: training
      - name: batch
        tenant: local
        quota: {{local: {{gpu: {half_gpu}, cpu: {cpus // 2}}}}}
        default_priority_class: experiment
"""


def this_machine_cluster_text() -> str:
    found = nvml_gpus()
    cpus = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        memory = 8 * 1024**3
    gib = max(1, memory // 1024**3)
    if found:
        return local_cluster_text(len(found), cpus, gib, virtual=False)
    return local_cluster_text(VIRTUAL_GPUS, cpus, gib, virtual=True)


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {host}:{port} ({exc.strerror}); is another 'allot up' "
                "running? Stop it, or pick another port with --port"
            ) from exc


class Server:
    """Everything ``allot up`` runs. :meth:`open` builds it, :meth:`run` serves until
    interrupted, :meth:`close` stops the loop (replicas keep running)."""

    def __init__(self, options: ServerOptions, *, clock: Callable[[], float] = time.time):
        self.options = options
        self.clock = clock
        self.engine: Engine | None = None
        self.sessions: sessionmaker[Session] | None = None
        self.state: ClusterState | None = None
        """The cluster in use: owned here, shared with the API, the loop and webhooks."""
        self.host: SchedulerHost | None = None
        """The scheduler's side, in this process (None when it runs in its own)."""
        self.scheduler: SchedulerProcess | None = None
        """The scheduler's process, when it runs in one of its own."""
        self.app: FastAPI | None = None
        """The API, when this process serves it (not with several API processes)."""
        self.token: str | None = None
        self.config_path: Path | None = None
        self.executor: Executor | None = None
        self.webhooks: WebhookDeliveries | None = None
        self.traffic = ServiceTraffic()
        """Requests in flight per service: counted by the proxy, read by the leader's
        service controller."""
        self.counters: SharedCounters | None = None
        """With several API processes: the counters they share with this one."""
        self.relay: Relay | None = None
        """With several API processes: where their messages arrive."""

    # ------------------------------------------------------------------ build

    def open(self) -> None:
        """Build everything, without serving. Raises :class:`StartupError` or a domain
        ``InvalidInput`` (a bad cluster file) with what to change."""
        options = self.options
        _check_port(options.host, options.port)
        # The store, the replicas' specs (their environment, secrets included) and the
        # work areas are the server user's alone.
        options.data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        options.data_dir.chmod(PRIVATE_DIR)
        self.engine = make_engine(options.database_url)
        try:
            migrate.upgrade(self.engine)
        except Exception as exc:
            url = make_url(options.database_url).render_as_string(hide_password=True)
            raise StartupError(f"cannot open the store at {url}: {exc}") from exc
        _private_sqlite_files(options.database_url)
        self.sessions = session_factory(self.engine)
        cluster = self._cluster(self.sessions)
        try:
            self.executor = make_executor(options.data_dir, cluster)
        except ExecutorNotReady as exc:
            raise StartupError(str(exc)) from exc
        if options.api_processes > 1:
            # Others apply configurations too: each read looks whether one did.
            self.counters = SharedCounters(options.data_dir / COUNTERS_FILE)
            sessions = self.sessions
            self.state = StoredClusterState(
                cluster,
                nodes_of=self.executor.nodes,
                counters=self.counters,
                load=lambda: stored_cluster(sessions),
            )
        else:
            self.state = ClusterState(cluster, nodes_of=self.executor.nodes)
            self.state.apply(cluster)  # on the executor's nodes where it reports them
        self.webhooks = server_upkeep(self.state.current, self.sessions, clock=self.clock)
        settings = HostSettings(
            data_dir=options.data_dir,
            database_url=options.database_url,
            tick_s=options.tick_s,
            reconcile_every_s=options.reconcile_every_s,
            stop_grace_s=options.stop_grace_s,
            base=options.cluster_file.parent if options.cluster_file else None,
        )
        wake: Callable[[], None]
        if options.scheduler_process:
            self.scheduler = SchedulerProcess(settings, self.state, on_alert=self.webhooks.wake)
            wake, self.traffic = self.scheduler.wake, self.scheduler.traffic
        else:
            self.host = SchedulerHost(
                settings,
                engine=self.engine,
                sessions=self.sessions,
                state=self.state,
                executor=self.executor,
                traffic=self.traffic,
                clock=self.clock,
                on_alert=self.webhooks.wake,
            )
            wake = self.host.wake
        self.token = self._admin_token()
        if options.api_processes > 1:
            self.relay = Relay(
                wake=wake,
                cluster_changed=self._cluster_changed,
                traffic=lambda: self.traffic,
            )
            self.relay.listener.start()
        else:
            self.app = api_app(
                state=self.state,
                sessions=self.sessions,
                tokens=StoreTokens(self.sessions, clock=self.clock),
                admin_digest=token_digest(self.token),
                admin_user=local_user(),
                after_write=wake,
                work_root=self.work_root,
                rate_limit=options.rate_limit,
                executor=self.executor,
                traffic=self.traffic,
                clock=self.clock,
            )
            self.app.state.on_cluster_change = lambda _cluster: self._cluster_changed()
        self.webhooks.start()
        if self.scheduler is not None:
            try:
                self.scheduler.start()
            except SchedulerNotStarted as exc:
                raise StartupError(str(exc)) from exc
        elif self.host is not None:
            self.host.start()

    @property
    def work_root(self) -> Path:
        return self.options.data_dir / "work"

    def _cluster(self, sessions: sessionmaker[Session]) -> Cluster:
        """``-f`` if given (stored as a new version when it differs), else the stored
        configuration, else this machine."""
        options = self.options
        if options.cluster_file is not None:
            try:
                text = options.cluster_file.read_text()
            except OSError as exc:
                raise StartupError(f"cannot read {options.cluster_file}: {exc}") from exc
            source = str(options.cluster_file)
        else:
            with sessions() as db:
                stored = current_cluster_config(db)
            if stored is not None:
                return load_cluster_text(stored.text, source="the stored cluster configuration")
            text, source = this_machine_cluster_text(), "the built-in local cluster"
        cluster = load_cluster_text(text, source=source)
        with sessions.begin() as db:
            apply_cluster_config(db, text, at=self.clock(), applied_by="allot up")
        return cluster

    def _admin_token(self) -> str:
        """The token of the local user's config when the server knows its digest; else
        a new one. Writes the config either way (the URL may have changed)."""
        options = self.options
        digest_file = options.data_dir / TOKEN_DIGEST_FILE
        try:
            stored = read_client_config(options.client_config).get("token")
        except InvalidInput:  # unreadable: it is rewritten below
            stored = None
        try:
            known = digest_file.read_text().strip()
        except OSError:
            known = ""
        if stored is not None and known and token_digest(stored) == known:
            token = stored
        else:
            token = secrets.token_urlsafe(32)
            fd = os.open(digest_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(token_digest(token) + "\n")
        self.config_path = write_client_config(options.url, token, options.client_config)
        return token

    def _cluster_changed(self) -> None:
        """A new configuration was applied (the API put it in the store and its cluster
        state): the leader's loop takes it at the start of its next turn, woken now (in
        a process of its own, it reads the stored one)."""
        if self.scheduler is not None:
            self.scheduler.cluster_changed()
        elif self.host is not None:
            self.host.wake()

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM; blocks. Call :meth:`open` first."""
        options = self.options
        served: FastAPI | str
        if options.api_processes > 1:
            # uvicorn's supervisor: binds the port, starts the API processes (each
            # builds its app from the settings file) and starts again one that ends.
            assert self.relay is not None and self.token is not None
            limit = options.rate_limit
            settings = ApiProcessSettings(
                data_dir=options.data_dir,
                database_url=options.database_url,
                admin_digest=token_digest(self.token),
                admin_user=local_user(),
                relay_port=self.relay.listener.port,
                relay_secret=self.relay.listener.secret,
                per_second=None if limit is None else limit.per_second,
                burst=1 if limit is None else limit.burst,
                reconcile_every_s=options.reconcile_every_s,
                server_pid=os.getpid(),
            )
            os.environ[SETTINGS_ENV] = str(settings.write())
            served = "allotment.api_processes:app_from_environment"
        else:
            assert self.app is not None
            served = self.app
        common: dict[str, Any] = {
            "host": options.host,
            "port": options.port,
            "log_level": "warning",
            "access_log": False,
            # uvicorn believes X-Forwarded-For from 127.0.0.1 by default: any local
            # client could then pick the address it is audited and rate-limited as.
            "proxy_headers": bool(options.trusted_proxies),
            "forwarded_allow_ips": ",".join(options.trusted_proxies) or None,
        }
        try:
            if isinstance(served, str):
                uvicorn.run(served, factory=True, workers=options.api_processes, **common)
            else:
                uvicorn.Server(uvicorn.Config(served, **common)).run()
        finally:
            self.close()

    @property
    def leading(self) -> bool:
        """Whether this server's scheduler side leads (in its process, or in this one)."""
        if self.scheduler is not None:
            return self.scheduler.alive and self.scheduler.leading
        return self.host is not None and self.host.leading

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.host is not None:
            self.host.stop()
        if self.relay is not None:
            self.relay.listener.stop()
        if self.webhooks is not None:
            self.webhooks.stop(timeout=2.0)  # a try cut short is made again (its lease expires)
        if self.engine is not None:
            self.engine.dispose()


PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def _private_sqlite_files(url: str) -> None:
    """A SQLite store's files (the database and its journals), mode 0600."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return
    database = Path(parsed.database)
    for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
        with contextlib.suppress(FileNotFoundError):
            path.chmod(PRIVATE_FILE)


def _executor_line(cluster: Cluster) -> str:
    slurm = cluster.executor.slurm
    what = "containers (Podman)" if cluster.runtime.containers else "processes"
    if slurm is None:
        return f"local {what} on this machine"
    return f"Slurm, partition {slurm.partition}, {what} (nodes and their health from Slurm)"


def _isolation_lines(server: Server) -> list[str]:
    """What the executor enforces, one aspect a line (say plainly what is not)."""
    enforced = server.executor.enforcement() if server.executor is not None else {}
    if not enforced:
        return []
    return ["  isolation:"] + [f"    {aspect:<9} {text}" for aspect, text in enforced.items()]


def describe(server: Server) -> list[str]:
    """What ``allot up`` prints once it is ready."""
    options = server.options
    assert server.state is not None and server.token is not None
    cluster = server.state.current()
    gpus = sum(node.gpu_count for node in cluster.nodes.values())
    url = make_url(options.database_url).render_as_string(hide_password=True)
    return [
        f"Allotment is up at {options.url}",
        f"  dashboard: {options.url}/?token={server.token}",
        f"  store:     {url}",
        f"  cluster:   {len(cluster.pools)} pool(s), {len(cluster.nodes)} node(s), "
        f"{gpus} GPU(s), {len(cluster.leaves)} leaf queue(s)",
        f"  executor:  {_executor_line(cluster)}",
        *(
            [f"  API:       {options.api_processes} processes on port {options.port}"]
            if options.api_processes > 1
            else []
        ),
        *_isolation_lines(server),
        f"  CLI config written to {server.config_path}",
        (
            f"  scheduler: running in a process of its own (pid {server.scheduler.pid})"
            if server.scheduler is not None
            else "  scheduler: running here"
        )
        if server.leading
        else "  scheduler: another server leads on this store; this one serves the API and "
        "takes over if it goes away",
        "Try: allot run --gpus 1 -- nvidia-smi   (or any command; see README)",
        "Stop with Ctrl-C; running jobs keep running and are re-adopted on the next start.",
    ]


__all__ = [
    "InvalidInput",
    "Server",
    "ServerOptions",
    "StartupError",
    "default_data_dir",
    "describe",
    "local_cluster_text",
    "spare_core",
]
