"""The scheduler's side of a server: the leader election and what a leader runs (the
control loop's runner, its upkeep and the service controller), in the server's own
process or in a process of its own.

:class:`SchedulerHost` is built by the composition root (``server.py``) from parts it
already holds: the store's engine, the one :class:`ClusterState`, the executor, the
proxy's :class:`ServiceTraffic`. In a process of its own (``allot up
--scheduler-process``), :func:`main` builds those parts itself on the same store and
listens for the API's messages (:mod:`allotment.control.wake`): a write wakes the loop,
a new stored configuration is taken, the proxy's request counts reach the service
controller; and it tells the API's process of each alert it raises, for webhook delivery.
The API process learns the port and secret from the first line this process prints, and
gives its own on this process's standard input (:func:`follow_commands`); this process
ends when that input closes (the API process is gone) or reads ``stop``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.cluster_state import ClusterState
from allotment.control.leader import LeaderElection
from allotment.control.loop import DEFAULT_STOP_GRACE_S, ControlLoop
from allotment.control.runner import DEFAULT_RECONCILE_EVERY_S, DEFAULT_TICK_S, LoopRunner
from allotment.control.services import ServiceController, ServiceTraffic
from allotment.control.wake import WakeListener, WakeSender
from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import Executor
from allotment.executors.local import LocalExecutor
from allotment.executors.slurm import SlurmExecutor
from allotment.store.configs import current_cluster_config
from allotment.store.db import make_engine, session_factory
from allotment.store.fencing import fence, take_term
from allotment.upkeep import housekeeper_for, leader_upkeep

log = logging.getLogger("allotment.scheduler")


@dataclass(frozen=True, kw_only=True)
class HostSettings:
    """What the scheduler's side needs to know of the server's options."""

    data_dir: Path
    database_url: str
    tick_s: float = DEFAULT_TICK_S
    reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    base: Path | None = None
    """Where relative paths of the cluster file are taken from (telemetry readings)."""

    @property
    def work_root(self) -> Path:
        return self.data_dir / "work"

    def to_json(self) -> str:
        return json.dumps(
            {
                "data_dir": str(self.data_dir),
                "database_url": self.database_url,
                "tick_s": self.tick_s,
                "reconcile_every_s": self.reconcile_every_s,
                "stop_grace_s": self.stop_grace_s,
                "base": None if self.base is None else str(self.base),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> HostSettings:
        raw = json.loads(text)
        return cls(
            data_dir=Path(raw["data_dir"]),
            database_url=raw["database_url"],
            tick_s=float(raw["tick_s"]),
            reconcile_every_s=float(raw["reconcile_every_s"]),
            stop_grace_s=float(raw["stop_grace_s"]),
            base=None if raw["base"] is None else Path(raw["base"]),
        )


class ExecutorNotReady(Exception):
    """The executor the cluster names cannot run jobs here; the message lists why."""


def make_executor(data_dir: Path, cluster: Cluster) -> Executor:
    """The executor the cluster file names (this machine, or Slurm), checked first."""
    slurm = cluster.executor.slurm
    executor: Executor
    if slurm is None:
        executor = LocalExecutor(data_dir / "executor", runtime=cluster.runtime)
        what = "This machine"
    else:
        executor = SlurmExecutor(slurm, data_dir / "executor-slurm", runtime=cluster.runtime)
        what = "Slurm"
    problems = executor.check()
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise ExecutorNotReady(f"{what} is not ready for Allotment:\n{listed}")
    return executor


class SchedulerHost:
    """Leads when it holds the leader lock: each term gets its own fenced sessions, loop,
    runner, upkeep and service controller. :meth:`start` tries at once."""

    def __init__(
        self,
        settings: HostSettings,
        *,
        engine: Engine,
        sessions: sessionmaker[Session],
        state: ClusterState,
        executor: Executor,
        traffic: ServiceTraffic,
        clock: Callable[[], float] = time.time,
        on_alert: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.sessions = sessions
        self.state = state
        self.executor = executor
        self.traffic = traffic
        self.clock = clock
        self.on_alert = on_alert
        self.loop: ControlLoop | None = None
        self.election = LeaderElection(engine, self._make_runner, on_change=_leading)
        self.listener = WakeListener(_handler(self))
        """Its messages (see :mod:`allotment.control.wake`): from the API when it runs
        in a process of its own, and from the executor when a replica ends."""

    @property
    def leading(self) -> bool:
        return self.election.leading

    def start(self) -> None:
        self.listener.start()
        self.election.start()

    def stop(self) -> None:
        self.election.stop()
        self.listener.stop()

    def wake(self) -> None:
        """Run a turn now, if this host leads. Never blocks."""
        self.election.wake()

    def take_stored_cluster(self) -> None:
        """Use the newest stored configuration (another process may have applied one)."""
        with self.sessions() as db:
            stored = current_cluster_config(db)
        if stored is not None:
            self.state.apply(
                load_cluster_text(stored.text, source="the stored cluster configuration")
            )

    def _alerted(self) -> None:
        """An alert was raised: tell whoever delivers webhooks (set at any time)."""
        on_alert = self.on_alert
        if on_alert is not None:
            on_alert()

    def _make_runner(self) -> LoopRunner:
        """A loop on the newest stored cluster, for one term as leader."""
        self.take_stored_cluster()
        settings = self.settings
        # This term's own sessions: each of their transactions proves the term first, so
        # nothing of this leader is written once another server has taken over.
        term = take_term(self.sessions, holder=_holder(), at=self.clock())
        fenced = fence(session_factory(self.engine), term)
        log.info("leading under term %d", term)
        # A replica's end wakes this leader at once (its devices are free for the next
        # job), rather than at the loop's next tick.
        self.executor.wake_on_end(self.listener.port, self.listener.secret)
        self.loop = ControlLoop(
            self.state,
            fenced,
            self.executor,
            work_root=settings.work_root,
            clock=self.clock,
            stop_grace_s=settings.stop_grace_s,
        )
        runner = LoopRunner(
            self.loop, tick_s=settings.tick_s, reconcile_every_s=settings.reconcile_every_s
        )
        keeper = housekeeper_for(
            self.state.current,
            fenced,
            usage=self.executor.usage,
            clock=self.clock,
            work_root=settings.work_root,
            orphan_gpus=self.loop.orphans.gpu_processes,
            wake=runner.wake,
            lock=runner.lock,
            base=settings.base,
        )
        upkeep = leader_upkeep(keeper, on_alert=self._alerted)
        runner.steps.extend(upkeep.steps)
        runner.companions.append(upkeep.housekeeper)
        runner.companions.append(
            ServiceController(fenced, traffic=self.traffic, clock=self.clock, wake=runner.wake)
        )
        return runner


def _leading(leading: bool) -> None:
    if leading:
        log.warning("this server now runs the scheduler")
    else:
        log.warning("this server no longer runs the scheduler: another one leads")


def _holder() -> str:
    """Who leads, for the record: host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


# ----------------------------------------------------------------- its own process

START_TIMEOUT_S = 60.0
"""How long the API process waits for its scheduler process to listen."""
WATCH_S = 1.0
"""How often the API process looks whether its scheduler process still runs."""


class SchedulerNotStarted(Exception):
    """The scheduler's process ended or said nothing before it listened."""


class ForwardedTraffic(ServiceTraffic):
    """The proxy's request counts, also sent to the scheduler's process (whose service
    controller reads them) as they change, and every second as levels (:meth:`resend`),
    so that a lost message is corrected."""

    def __init__(self) -> None:
        super().__init__()
        self.sender: WakeSender | None = None

    def begin(self, service_id: str) -> None:
        super().begin(service_id)
        if self.sender is not None:
            self.sender.send("begin", service_id)

    def end(self, service_id: str) -> None:
        super().end(service_id)
        if self.sender is not None:
            self.sender.send("end", service_id)

    def resend(self) -> None:
        """Send each service's requests in flight now."""
        sender = self.sender
        if sender is not None:
            for service_id, in_flight in self.levels().items():
                sender.send("level", service_id, str(in_flight))


class SchedulerProcess:
    """The scheduler's side in a process of its own (``python -m allotment.host``), seen
    from the API's process: started and stopped with the server, woken by messages, and
    started again if it ends by itself. The cluster state here takes the executor's
    nodes every ``reconcile_every_s`` (:meth:`ClusterState.refresh_nodes`; the loop does
    so in its own process), so that the API shows the nodes' health too."""

    def __init__(
        self,
        settings: HostSettings,
        state: ClusterState,
        *,
        on_alert: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.traffic = ForwardedTraffic()
        self._alerts: WakeListener | None = None
        if on_alert is not None:
            self._alerts = WakeListener(lambda kind, words: on_alert() if kind == "alert" else None)
        self.process: subprocess.Popen[bytes] | None = None
        self.leading = False
        """Whether it led when it last started (another server may hold the lock)."""
        self._sender: WakeSender | None = None
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._watching, name="allotment-watch", daemon=True)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start it and wait until it listens; raises :class:`SchedulerNotStarted`."""
        if self._alerts is not None:
            self._alerts.start()
        self._spawn()
        self._watch.start()

    def wake(self) -> None:
        sender = self._sender
        if sender is not None:
            sender.wake()

    def cluster_changed(self) -> None:
        sender = self._sender
        if sender is not None:
            sender.send("cluster")

    def stop(self) -> None:
        """Ask it to stop (its runner stops, replicas keep running), then wait."""
        self._stopping.set()
        if self._watch.is_alive():
            self._watch.join(timeout=10)
        self._end()
        if self._alerts is not None:
            self._alerts.stop()

    def _spawn(self) -> None:
        process = self.process = subprocess.Popen(
            [sys.executable, "-m", "allotment.host"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert process.stdout is not None
        # Its settings down the pipe, never on its command line, where every local user
        # could read the store's URL (and a password in it).
        self._command(self.settings.to_json())
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
        words = process.stdout.readline().decode().split() if ready else []
        if len(words) != 3:
            self._end()
            raise SchedulerNotStarted(
                "the scheduler's process did not start"
                + (f" (exit status {process.returncode})" if ready else " in time")
                + "; see its messages above"
            )
        self._sender = WakeSender(int(words[0]), words[1])
        self.leading = words[2] == "leading"
        self.traffic.sender = self._sender
        if self._alerts is not None:
            # Down the pipe, not on its command line, where other users could read it.
            self._command(f"alerts {self._alerts.port} {self._alerts.secret}")

    def _command(self, line: str) -> None:
        process = self.process
        try:
            assert process is not None and process.stdin is not None
            process.stdin.write(f"{line}\n".encode())
            process.stdin.flush()
        except OSError:  # it has ended: the watch starts it again
            pass

    def _end(self) -> None:
        self.traffic.sender = None
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.close()
        process = self.process
        if process is None or process.poll() is not None:
            return
        self._command("stop")
        try:
            assert process.stdin is not None
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def _watching(self) -> None:
        nodes_at = time.monotonic() + self.settings.reconcile_every_s
        while not self._stopping.wait(WATCH_S):
            self.traffic.resend()
            if not self.alive:
                code = None if self.process is None else self.process.returncode
                log.error("the scheduler's process ended (exit status %s); starting it again", code)
                try:
                    self._spawn()
                except SchedulerNotStarted:
                    log.exception("the scheduler's process did not start again")
            if time.monotonic() >= nodes_at:
                nodes_at = time.monotonic() + self.settings.reconcile_every_s
                self.state.refresh_nodes()


def _handler(host: SchedulerHost) -> Callable[[str, list[str]], None]:
    def handle(kind: str, words: list[str]) -> None:
        if kind == "cluster":
            host.take_stored_cluster()
            host.wake()
        elif kind == "wake":
            host.wake()
        elif kind == "begin" and words:
            host.traffic.begin(words[0])
        elif kind == "end" and words:
            host.traffic.end(words[0])
        elif kind == "level" and len(words) == 2 and words[1].isdigit():
            host.traffic.level(words[0], int(words[1]))

    return handle


def follow_commands(host: SchedulerHost, lines: Iterable[str]) -> None:
    """The API process's commands, one per line of the scheduler process's standard
    input, until ``stop`` or its end: ``alerts PORT SECRET`` says where to tell it that
    an alert was raised (its webhook delivery runs there), as an ``alert`` message."""
    for line in lines:
        words = line.split()
        if words == ["stop"]:
            return
        if len(words) == 3 and words[0] == "alerts" and words[1].isdigit():
            host.on_alert = functools.partial(WakeSender(int(words[1]), words[2]).send, "alert")


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> int:
    """The scheduler in a process of its own: ``python -m allotment.host``, its settings
    (:class:`HostSettings`, JSON) the first line of its standard input. Prints ``PORT
    SECRET leading|following`` once it listens (and leads, if the lock was free), then
    runs until standard input closes or reads ``stop``."""
    # Its lifetime is the API process's: Ctrl-C in a terminal reaches both, and only that
    # one decides; a SIGTERM stops it as "stop" does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    first = sys.stdin.readline()
    if not first.strip():
        print("no settings on standard input", file=sys.stderr)
        return 1
    settings = HostSettings.from_json(first)
    engine = make_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        with sessions() as db:
            stored = current_cluster_config(db)
        if stored is None:
            print("no cluster configuration is stored", file=sys.stderr)
            return 1
        cluster = load_cluster_text(stored.text, source="the stored cluster configuration")
        try:
            executor = make_executor(settings.data_dir, cluster)
        except ExecutorNotReady as exc:
            print(str(exc), file=sys.stderr)
            return 1
        state = ClusterState(cluster, nodes_of=executor.nodes)
        state.apply(cluster)
        host = SchedulerHost(
            settings,
            engine=engine,
            sessions=sessions,
            state=state,
            executor=executor,
            traffic=ServiceTraffic(),
        )
        host.start()
        leading = "leading" if host.leading else "following"
        print(f"{host.listener.port} {host.listener.secret} {leading}", flush=True)
        # Nobody reads standard output after that line: whatever else is written there
        # (by this process or one it starts) goes to standard error, never into a pipe
        # that could fill up.
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        try:
            follow_commands(host, sys.stdin)
        finally:
            host.stop()
        return 0
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
