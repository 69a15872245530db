"""Telemetry and reaping on a thread of their own, beside the control loop.

Every ``interval_s`` a :class:`Housekeeper` step: takes a telemetry sample
(:class:`~allotment.upkeep.sampler.Sampler`; the GPU source and ``/proc`` are read
outside any lock), hands the readings to the orphan check, decides and applies idle and
TTL reaping (:mod:`allotment.upkeep.reaping`: read outside any lock, then written in
one short transaction under the loop runner's lock, so it never interleaves with a
scheduling turn), then wakes the loop so that reaped jobs' replicas are stopped and
their GPUs given to waiting jobs at once. Less often it expires scratch data and
deletes usage rows and idempotency keys past their retention.

Runs only where the control loop runs (on the leading server); a step that raises is
logged and the next one goes on.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.cluster import Cluster
from allotment.executors.base import ReplicaKey, ReplicaUsage
from allotment.store import idempotency
from allotment.telemetry.sources import DeviceReading, make_source
from allotment.upkeep import reaping
from allotment.upkeep.reaping import Decision
from allotment.upkeep.sampler import Sample, Sampler
from allotment.upkeep.scratch import Cursor, ScratchAction, expire_scratch

log = logging.getLogger(__name__)

DEFAULT_SCRATCH_EVERY_S = 60.0
DEFAULT_PRUNE_EVERY_S = 3600.0

OrphanCheck = Callable[[DbSession, Iterable[DeviceReading], set[int], float], list[int]]
"""``(db, readings, owned pids, now) -> pids killed``: the orphan GPU process check."""


@dataclass
class Step:
    """What one :meth:`Housekeeper.step` did."""

    sample: Sample | None = None
    decisions: list[Decision] = field(default_factory=list)
    scratch: list[ScratchAction] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    pruned: int = 0
    """Usage rows past the retention and idempotency keys past theirs, deleted."""


class Housekeeper:
    """Samples, reaps and expires for the cluster ``cluster()`` returns. ``sessions``
    are the leader's (fenced) store sessions; ``orphan_gpus`` reports (and under
    ``kill`` removes) GPU processes that no running replica owns and returns the pids
    killed; ``lock`` is the loop runner's (held while reaping writes); ``wake`` asks the
    loop for a turn."""

    def __init__(
        self,
        sampler: Sampler,
        *,
        sessions: sessionmaker[DbSession],
        cluster: Callable[[], Cluster],
        work_root: Path,
        interval_s: float,
        orphan_gpus: OrphanCheck = lambda db, readings, owned, now: [],
        wake: Callable[[], None] = lambda: None,
        lock: AbstractContextManager[object] | None = None,
        scratch_every_s: float = DEFAULT_SCRATCH_EVERY_S,
        prune_every_s: float = DEFAULT_PRUNE_EVERY_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.sampler = sampler
        self.sessions = sessions
        self.cluster = cluster
        self.clock = sampler.clock
        self.work_root = work_root
        self.interval_s = interval_s
        self.orphan_gpus = orphan_gpus
        self.wake = wake
        self.lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        self.scratch_every_s = scratch_every_s
        self.prune_every_s = prune_every_s
        self.steps = 0
        self.failures = 0
        self.reaped: dict[str, int] = {}
        """Jobs reaped by reason (``idle``, ``ttl``) since this housekeeper started."""
        self._next_scratch = 0.0
        self._scratch_cursors: dict[str, Cursor] = {}
        self._next_prune = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> Step:
        """One pass; blocks for a sample and a few short transactions."""
        out = Step()
        out.sample = self.sampler.sample()
        owned = {pid for u in out.sample.usage.values() for pid in u.pids}
        with self.sessions.begin() as db:
            out.killed = self.orphan_gpus(db, out.sample.readings, owned, self.clock())
        now = self.clock()
        cluster = self.cluster()
        with self.sessions() as db:  # the reading, outside the scheduler's lock
            decisions = reaping.gather(db, cluster, now)
        if decisions:
            with self.lock, self.sessions.begin() as db:
                # apply() locks each job and skips one that moved on since it was read
                out.decisions = reaping.apply(db, decisions, now, cluster.webhook_of)
        reaped = [d for d in out.decisions if d.action == "reap"]
        for decision in reaped:
            self.reaped[decision.reason] = self.reaped.get(decision.reason, 0) + 1
            log.warning("%s: %s", decision.job_id, decision.message)
        if reaped:
            self.wake()
        now = self.clock()
        if now >= self._next_scratch:
            out.scratch = expire_scratch(
                self.sessions, cluster, self.work_root, now, self._scratch_cursors
            )
            self._next_scratch = now + self.scratch_every_s
        if now >= self._next_prune:
            out.pruned = self.sampler.prune()
            with self.sessions.begin() as db:
                out.pruned += idempotency.prune(db, now=now)
            self._next_prune = now + self.prune_every_s
        return out

    def start(self) -> None:
        """Start the thread (once). Does not block."""
        if self._thread is not None:
            raise RuntimeError("the housekeeper has already started")
        self._thread = threading.Thread(target=self._run, name="allotment-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step; blocks until the thread ended (or ``timeout``)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.sampler.source.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except Exception:  # one bad step must not stop telemetry
                self.failures += 1
                log.exception("telemetry and reclamation step failed")
            self.steps += 1
            self._stopping.wait(self.interval_s)


def housekeeper_for(
    cluster: Callable[[], Cluster],
    sessions: sessionmaker[DbSession],
    *,
    usage: Callable[[], Mapping[ReplicaKey, ReplicaUsage]],
    clock: Callable[[], float],
    work_root: Path,
    orphan_gpus: OrphanCheck,
    wake: Callable[[], None],
    lock: AbstractContextManager[object],
    base: Path | None = None,
) -> Housekeeper:
    """A housekeeper as the cluster's ``telemetry`` section configures it: its source (a
    relative fake-readings ``file`` is taken from ``base``), interval, aggregation and
    retention; replicas' CPU and memory from ``usage`` (the executor's)."""
    current = cluster()
    settings = current.source.telemetry
    nodes = list(current.nodes)
    node = settings.node or (nodes[0] if len(nodes) == 1 else socket.gethostname())
    source = make_source(settings.source, node=node, file=settings.file, base=base)
    sampler = Sampler(
        source,
        sessions,
        usage=usage,
        clock=clock,
        aggregate_s=settings.aggregate,
        retention_s=settings.retention,
    )
    return Housekeeper(
        sampler,
        sessions=sessions,
        cluster=cluster,
        work_root=work_root,
        interval_s=settings.interval,
        orphan_gpus=orphan_gpus,
        wake=wake,
        lock=lock,
    )
