"""Telemetry and reclamation on a thread of their own, beside the control loop.

Every ``interval_s`` a :class:`Housekeeper` step: takes a telemetry sample
(:class:`~allotment.control.sampler.Sampler`; the GPU source and ``/proc`` are read
outside any lock), reports orphan GPU processes, decides and applies idle and TTL
reclamation (:mod:`allotment.control.reclaim`: read outside any lock, then written in
one short transaction under the loop runner's lock, so it never interleaves with a
scheduling turn), then wakes the loop so
that reclaimed jobs' replicas are stopped and their GPUs given to waiting jobs at
once. Less often it expires scratch data and deletes usage rows past the retention.

Runs only where the control loop runs (on the leading server); a step that raises is
logged and the next one goes on.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from allotment.control import reclaim
from allotment.control.loop import ControlLoop
from allotment.control.reclaim import Decision
from allotment.control.sampler import Sample, Sampler
from allotment.control.scratch import Cursor, ScratchAction, expire_scratch
from allotment.telemetry.sources import make_source

log = logging.getLogger(__name__)

DEFAULT_SCRATCH_EVERY_S = 60.0
DEFAULT_PRUNE_EVERY_S = 3600.0


@dataclass
class Step:
    """What one :meth:`Housekeeper.step` did."""

    sample: Sample | None = None
    decisions: list[Decision] = field(default_factory=list)
    scratch: list[ScratchAction] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    pruned: int = 0


class Housekeeper:
    """Samples, reclaims and expires for ``loop``'s cluster. ``lock`` is the loop
    runner's (held while reclamation writes); ``wake`` asks the loop for a turn."""

    def __init__(
        self,
        loop: ControlLoop,
        sampler: Sampler,
        *,
        interval_s: float,
        wake: Callable[[], None] = lambda: None,
        lock: AbstractContextManager[object] | None = None,
        scratch_every_s: float = DEFAULT_SCRATCH_EVERY_S,
        prune_every_s: float = DEFAULT_PRUNE_EVERY_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.loop = loop
        self.sampler = sampler
        self.interval_s = interval_s
        self.wake = wake
        self.lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        self.scratch_every_s = scratch_every_s
        self.prune_every_s = prune_every_s
        self.steps = 0
        self.failures = 0
        self.reclaims: dict[str, int] = {}
        """Reclamations by reason (``idle``, ``ttl``) since this housekeeper started."""
        self._next_scratch = 0.0
        self._scratch_cursors: dict[str, Cursor] = {}
        self._next_prune = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> Step:
        """One pass; blocks for a sample and a few short transactions."""
        out = Step()
        loop = self.loop
        out.sample = self.sampler.sample()
        owned = {pid for u in out.sample.usage.values() for pid in u.pids}
        with loop.store_sessions.begin() as db:
            out.killed = loop.orphans.gpu_processes(db, out.sample.readings, owned, loop.clock())
        now = loop.clock()
        cluster = loop.cluster
        with loop.store_sessions() as db:  # the reading, outside the scheduler's lock
            decisions = reclaim.gather(db, cluster, now)
        if decisions:
            with self.lock, loop.store_sessions.begin() as db:
                # apply() locks each job and skips one that moved on since it was read
                out.decisions = reclaim.apply(db, decisions, now, cluster.webhook_of)
        for decision in out.decisions:
            if decision.action == "reclaim":
                self.reclaims[decision.reason] = self.reclaims.get(decision.reason, 0) + 1
                log.warning("%s: %s", decision.job_id, decision.message)
        if any(d.action == "reclaim" for d in out.decisions):
            self.wake()
        now = loop.clock()
        if now >= self._next_scratch:
            out.scratch = expire_scratch(
                loop.store_sessions, loop.cluster, loop.work_root, now, self._scratch_cursors
            )
            self._next_scratch = now + self.scratch_every_s
        if now >= self._next_prune:
            out.pruned = self.sampler.prune()
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
    loop: ControlLoop,
    *,
    wake: Callable[[], None],
    lock: AbstractContextManager[object],
    base: Path | None = None,
) -> Housekeeper:
    """A housekeeper for ``loop`` as the cluster's ``telemetry`` section configures it:
    its source (a relative fake-readings ``file`` is taken from ``base``), interval,
    aggregation and retention; CPU and memory from the loop's executor."""
    settings = loop.cluster.source.telemetry
    nodes = list(loop.cluster.nodes)
    node = settings.node or (nodes[0] if len(nodes) == 1 else socket.gethostname())
    source = make_source(settings.source, node=node, file=settings.file, base=base)
    sampler = Sampler(
        source,
        loop.store_sessions,
        usage=loop.executor.usage,
        clock=loop.clock,
        aggregate_s=settings.aggregate,
        retention_s=settings.retention,
    )
    return Housekeeper(loop, sampler, interval_s=settings.interval, wake=wake, lock=lock)
