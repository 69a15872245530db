"""More than one API process (``allot up --api-processes N``): the HTTP API served by N
processes on one listening socket, for more requests a second than one interpreter lock
allows.

With N of 2 or more, the process of ``allot up`` (the *server*) keeps everything that
must run once -- the store's migration, the scheduler's side (in a process of its own or
on a thread), webhook delivery -- and uvicorn's supervisor there starts N API processes
on the server's socket (the kernel spreads connections over them) and starts one again
when it ends. Each builds the same app from :func:`api_app` on the same store, and keeps
in step with the others through three things:

- **The cluster in use.** Every API process and the server map one small file of
  counters in the data directory (:class:`SharedCounters`). A process that applies a new
  configuration stores it, then bumps the cluster counter; every process compares the
  counter with the one it last saw whenever it reads its cluster
  (:class:`StoredClusterState`), and reads the stored configuration again when it moved.
  So a configuration applied through one process is in use in every process for the next
  request, whichever process takes it.
- **Revoked tokens.** A token found valid is remembered for two seconds; revoking one
  bumps the tokens counter, and every process forgets what it remembers when it sees
  that counter move (:class:`SharedStoreTokens`).
- **Messages to the server** (:class:`Relay`): UDP datagrams on 127.0.0.1, signed with a
  secret that the API processes read from a file of the data directory (the server's
  user's alone; never on a command line): ``wake`` after a write, ``cluster`` after a
  new configuration, and the service proxy's ``begin``/``end``/``level`` counts, each
  with the sending process's id so that the server adds them up (and ``alive`` every
  second: the counts of a process silent for 5 s, which has ended, are dropped). The
  server hands them on as if its own API had made them.

The rate limit is kept in each process (a token may make N times the limit's requests,
spread over the processes). An API process ends when the server does (it watches its
parent).
"""

from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.app import create_app
from allotment.api.auth import AdminDigest, FirstOf, Principal, StoreTokens
from allotment.api.ratelimit import RateLimit
from allotment.control.cluster_state import ClusterState, NodesOf
from allotment.control.services import ServiceTraffic
from allotment.control.wake import WakeListener, WakeSender
from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import Executor
from allotment.executors.supervisor import write_text_private
from allotment.host import make_executor
from allotment.store.configs import current_cluster_config
from allotment.store.db import make_engine, session_factory

log = logging.getLogger("allotment.api_processes")

SETTINGS_ENV = "ALLOTMENT_API_SETTINGS"
"""The environment variable naming the file of the API processes' settings (JSON, in the
data directory, mode 0600: it holds the relay's secret)."""
SETTINGS_FILE = "api-settings.json"
COUNTERS_FILE = "api-counters"
"""In the data directory: the counters every API process of a server maps."""
WATCH_S = 0.5
"""How often an API process looks whether its server still runs."""
SILENT_S = 5.0
"""An API process not heard from for this long has ended: its counts are dropped."""


# ------------------------------------------------------------------ shared state


class SharedCounters:
    """Counters in a small file that every process of one server maps: read without a
    system call, bumped under a file lock."""

    CLUSTER = 0
    TOKENS = 1
    _SLOTS = 2
    _SIZE = 8 * _SLOTS

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < self._SIZE:
            os.ftruncate(self._fd, self._SIZE)
        self._map = mmap.mmap(self._fd, self._SIZE)

    def read(self, slot: int) -> int:
        value: int = struct.unpack_from("<Q", self._map, 8 * slot)[0]
        return value

    def bump(self, slot: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            struct.pack_into("<Q", self._map, 8 * slot, self.read(slot) + 1)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


def stored_cluster(sessions: sessionmaker[Session]) -> Cluster | None:
    """The newest stored configuration (None: none is stored)."""
    with sessions() as db:
        stored = current_cluster_config(db)
    if stored is None:
        return None
    return load_cluster_text(stored.text, source="the stored cluster configuration")


class StoredClusterState(ClusterState):
    """The cluster in use in one of several processes on one store: a configuration
    applied here is announced through the shared counter, and one applied elsewhere is
    read from the store when the counter says so, before the cluster is next read."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        nodes_of: NodesOf | None,
        counters: SharedCounters,
        load: Callable[[], Cluster | None],
    ) -> None:
        super().__init__(cluster, nodes_of=nodes_of)
        self._counters = counters
        self._load = load
        self._seen = counters.read(SharedCounters.CLUSTER)
        self._reloading = threading.Lock()
        super().apply(cluster)  # on the executor's nodes, announced to nobody

    def _fresh(self) -> None:
        seen = self._counters.read(SharedCounters.CLUSTER)
        if seen == self._seen:
            return
        with self._reloading:
            if seen == self._seen:
                return
            stored = self._load()
            if stored is not None:
                super().apply(stored)
            self._seen = seen

    def current(self) -> Cluster:
        self._fresh()
        return super().current()

    def snapshot(self) -> tuple[int, Cluster]:
        self._fresh()
        return super().snapshot()

    def apply(self, new: Cluster) -> None:
        """``new`` was stored: in use here now, and in the other processes from their
        next read (they read the newest stored one: two applied at once end alike)."""
        super().apply(new)
        self._counters.bump(SharedCounters.CLUSTER)


class SharedStoreTokens(StoreTokens):
    """:class:`StoreTokens` that forgets the tokens it remembers when another process
    of the server revoked one, and tells the others when a token is revoked here."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        clock: Callable[[], float],
        counters: SharedCounters,
    ) -> None:
        super().__init__(sessions, clock=clock)
        self._counters = counters
        self._generation = counters.read(SharedCounters.TOKENS)

    def forget(self) -> None:
        self._counters.bump(SharedCounters.TOKENS)
        super().forget()

    def _remembered(self, digest: str) -> Principal | None:
        generation = self._counters.read(SharedCounters.TOKENS)
        if generation != self._generation:
            self._generation = generation
            super().forget()
        return super()._remembered(digest)


# ------------------------------------------------------------------ the app


def api_app(
    *,
    state: ClusterState,
    sessions: sessionmaker[Session],
    tokens: StoreTokens,
    admin_digest: str,
    admin_user: str,
    after_write: Callable[[], None],
    work_root: Path,
    rate_limit: RateLimit | None,
    executor: Executor,
    traffic: ServiceTraffic,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """The API as every process of a server serves it."""
    return create_app(
        cluster=state,
        store_sessions=sessions,
        clock=clock,
        authenticator=FirstOf([AdminDigest(admin_digest, user=admin_user), tokens]),
        after_write=after_write,
        work_root=work_root,
        rate_limit=rate_limit,
        images=executor.images,
        enforcement=executor.enforcement,
        traffic=traffic,
    )


# ------------------------------------------------------------------ the server's side


class Relay:
    """The server's end of its API processes' messages: hands each on to ``wake``,
    ``cluster_changed`` and ``traffic``, whose requests in flight per service are the sum
    of each process's last count. Every API process speaks at least once a second (its
    levels, or ``alive``); the counts of one not heard for :data:`SILENT_S` are dropped,
    so that a process that ended with requests in flight leaves none behind."""

    def __init__(
        self,
        *,
        wake: Callable[[], None],
        cluster_changed: Callable[[], None],
        traffic: Callable[[], ServiceTraffic],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wake = wake
        self._cluster_changed = cluster_changed
        self._traffic = traffic
        self._monotonic = monotonic
        self._levels: dict[str, dict[str, int]] = {}
        """service -> sending process -> its requests in flight."""
        self._heard: dict[str, float] = {}
        """sending process -> when it last spoke."""
        self._lock = threading.Lock()
        self.listener = WakeListener(self.handle)

    def handle(self, kind: str, words: list[str]) -> None:
        if kind == "wake":
            self._wake()
        elif kind == "cluster":
            self._cluster_changed()
        elif kind == "alive" and len(words) == 1:
            self._counted(words[0])
        elif kind in ("begin", "end") and len(words) == 2:
            self._counted(words[1], words[0], by=1 if kind == "begin" else -1)
            traffic = self._traffic()
            if kind == "begin":
                traffic.begin(words[0])
            else:
                traffic.end(words[0])
        elif kind == "level" and len(words) == 3 and words[1].isdigit():
            service, count, sender = words
            self._counted(sender, service, level=int(count))

    def _counted(
        self, sender: str, service: str | None = None, *, by: int = 0, level: int | None = None
    ) -> None:
        """``sender`` spoke (of ``service``: a move ``by`` one, or its ``level``); set the
        sums that changed, those of silent processes dropped, on the traffic."""
        now = self._monotonic()
        with self._lock:
            self._heard[sender] = now
            changed: set[str] = set()
            if service is not None:
                counts = self._levels.setdefault(service, {})
                counts[sender] = level if level is not None else max(0, counts.get(sender, 0) + by)
                if level is not None:
                    changed.add(service)
            silent = {s for s, heard in self._heard.items() if now - heard > SILENT_S}
            for gone in silent:
                del self._heard[gone]
            for name, counts in self._levels.items():
                if silent & counts.keys():
                    for gone in silent & counts.keys():
                        del counts[gone]
                    changed.add(name)
            totals = {name: sum(self._levels[name].values()) for name in changed}
        traffic = self._traffic()
        for name, total in totals.items():
            traffic.level(name, total)


@dataclass(frozen=True, kw_only=True)
class ApiProcessSettings:
    """What an API process needs of the server (JSON in its environment)."""

    data_dir: Path
    database_url: str
    admin_digest: str
    admin_user: str
    relay_port: int
    relay_secret: str
    per_second: float | None
    burst: int
    reconcile_every_s: float
    server_pid: int
    """The server's process: an API process ends when it is no longer its parent."""

    def write(self) -> Path:
        """Write them to the data directory (mode 0600); return the file's path."""
        path = self.data_dir / SETTINGS_FILE
        write_text_private(path, json.dumps({**self.__dict__, "data_dir": str(self.data_dir)}))
        return path

    @classmethod
    def read(cls, path: Path) -> ApiProcessSettings:
        raw = json.loads(path.read_text())
        raw["data_dir"] = Path(raw["data_dir"])
        return cls(**raw)


# ------------------------------------------------------------------ an API process


class RelayedTraffic(ServiceTraffic):
    """The proxy's counts in an API process, also sent to the server as they change and
    every second as levels (a lost message is corrected), each with this process's id."""

    def __init__(self, sender: WakeSender) -> None:
        super().__init__()
        self.sender = sender
        self.source = str(os.getpid())

    def begin(self, service_id: str) -> None:
        super().begin(service_id)
        self.sender.send("begin", service_id, self.source)

    def end(self, service_id: str) -> None:
        super().end(service_id)
        self.sender.send("end", service_id, self.source)

    def resend(self) -> None:
        """Every second: this process's levels, and that it is alive."""
        self.sender.send("alive", self.source)
        for service_id, in_flight in self.levels().items():
            self.sender.send("level", service_id, str(in_flight), self.source)


def _watch(parent: int, traffic: RelayedTraffic, state: ClusterState, every_s: float) -> None:
    """End this process when the server has gone; send the proxy's levels every second;
    take the executor's nodes every ``every_s`` (Slurm's health, shown by the API)."""
    nodes_at = time.monotonic() + every_s
    resend_at = time.monotonic() + 1.0
    while True:
        if os.getppid() != parent:
            log.warning("the server has gone: this API process stops")
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(WATCH_S)
        now = time.monotonic()
        if now >= resend_at:
            resend_at = now + 1.0
            traffic.resend()
        if now >= nodes_at:
            nodes_at = now + every_s
            state.refresh_nodes()


def app_from_environment() -> FastAPI:
    """The app of one API process, from :data:`SETTINGS_ENV` (uvicorn's factory)."""
    settings = ApiProcessSettings.read(Path(os.environ[SETTINGS_ENV]))
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    cluster = stored_cluster(sessions)
    if cluster is None:
        raise RuntimeError("no cluster configuration is stored")
    executor = make_executor(settings.data_dir, cluster)
    counters = SharedCounters(settings.data_dir / COUNTERS_FILE)
    state = StoredClusterState(
        cluster, nodes_of=executor.nodes, counters=counters, load=lambda: stored_cluster(sessions)
    )
    sender = WakeSender(settings.relay_port, settings.relay_secret)
    traffic = RelayedTraffic(sender)
    limit = (
        None
        if settings.per_second is None
        else RateLimit(per_second=settings.per_second, burst=settings.burst)
    )
    app = api_app(
        state=state,
        sessions=sessions,
        tokens=SharedStoreTokens(sessions, clock=time.time, counters=counters),
        admin_digest=settings.admin_digest,
        admin_user=settings.admin_user,
        after_write=sender.wake,
        work_root=settings.data_dir / "work",
        rate_limit=limit,
        executor=executor,
        traffic=traffic,
    )
    app.state.on_cluster_change = lambda _cluster: sender.send("cluster")
    threading.Thread(
        target=_watch,
        args=(settings.server_pid, traffic, state, settings.reconcile_every_s),
        name="allotment-api-watch",
        daemon=True,
    ).start()
    return app
