"""Runs a :class:`~allotment.control.loop.ControlLoop` on a thread of its own.

Each turn observes the executor, runs one scheduling cycle and, every
``reconcile_every_s``, reconciles the store with the executor. A turn starts when
something happened (:meth:`LoopRunner.wake`: a submission, a cancellation, a new cluster
configuration), when the scheduler asked to be woken (a back-off or a time window), or
after ``tick_s`` at the latest. The first turn reconciles before anything else, so that a
restarted server re-adopts what runs and finds what ended while it was down.

A turn that raises is logged and the next one rebuilds the loop's scheduler session
from the store (the store is the source of truth), so one bad turn never stops the
scheduler. After the cycle, each of ``steps`` runs (the server adds the upkeep's, e.g.
the ``max_wait`` check); a step that raises is logged and fails nothing else.
Each cycle's duration is observed in :data:`CYCLE_SECONDS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import Histogram

from allotment.control.loop import ControlLoop
from allotment.store.fencing import Fenced

log = logging.getLogger(__name__)

CYCLE_SECONDS = Histogram(
    "allot_scheduler_cycle_seconds",
    "Duration of one scheduling cycle of this process's control loop.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=None,
)
"""Process-local: registered in each app's metrics registry (:mod:`allotment.api.metrics`)."""

DEFAULT_TICK_S = 1.0
DEFAULT_RECONCILE_EVERY_S = 30.0


class Companion(Protocol):
    """Work that runs beside the loop, started and stopped with it (telemetry)."""

    def start(self) -> None: ...

    def stop(self, timeout: float = 30.0) -> None: ...


class LoopRunner:
    """Drives ``loop`` until :meth:`stop`. ``steps`` run after each cycle, in order, on
    the runner's thread (they must be quick: they hold up the next turn). ``monotonic``
    is for tests."""

    def __init__(
        self,
        loop: ControlLoop,
        *,
        tick_s: float = DEFAULT_TICK_S,
        reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
        companions: Sequence[Companion] = (),
        steps: Sequence[Callable[[], object]] = (),
    ) -> None:
        if tick_s <= 0 or reconcile_every_s <= 0:
            raise ValueError("tick_s and reconcile_every_s must be positive")
        self.loop = loop
        self.tick_s = tick_s
        self.reconcile_every_s = reconcile_every_s
        self._monotonic = monotonic
        self.companions = list(companions)
        """Started after the loop's thread, stopped before it."""
        self.steps = list(steps)
        """Run after each cycle, in order."""
        self._woken = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()
        """Held during a turn: hold it to change what the loop works on."""
        self.turns = 0
        """Turns completed (read by tests and the health check)."""
        self.failures = 0
        """Turns that raised."""
        self.fenced = False
        """A turn found this server's leadership term over; the thread has ended."""
        self.last_error: str | None = None

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        """Start the thread (once). Does not block."""
        if self._thread is not None:
            raise RuntimeError("the runner has already started")
        self._thread = threading.Thread(target=self._run, name="allotment-loop", daemon=True)
        self._thread.start()
        for companion in self.companions:
            companion.start()

    def wake(self) -> None:
        """Ask for a turn as soon as the current one ends. Never blocks."""
        self._woken.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current turn; blocks until the thread has ended (or
        ``timeout``). Replicas keep running: a restarted server re-adopts them."""
        for companion in self.companions:
            companion.stop(timeout)
        self._stopping.set()
        self._woken.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def turn(self, *, reconcile: bool = False) -> float | None:
        """One turn on the caller's thread (the runner's thread calls it too); returns
        the scheduler's next wake-up (seconds since the epoch) if it asked for one."""
        with self.lock:
            if reconcile:
                self.loop.reconcile()
            self.loop.observe()
            with CYCLE_SECONDS.time():
                decisions = self.loop.cycle()
            self._run_steps()
            # Admissions and completions change what the next cycle sees: go again at
            # once rather than after a tick.
            if decisions.admitted or decisions.preemptions or decisions.stats.get("truncated"):
                self._woken.set()
            return decisions.next_wakeup

    def _run_steps(self) -> None:
        for step in self.steps:
            try:
                step()
            except Exception:  # a step must not fail the scheduler's turn
                log.exception("control loop step %r failed", step)

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        next_reconcile = 0.0
        while not self._stopping.is_set():
            self._woken.clear()
            now = self._monotonic()
            reconcile = now >= next_reconcile
            wait = self.tick_s
            try:
                wakeup = self.turn(reconcile=reconcile)
                if reconcile:
                    next_reconcile = now + self.reconcile_every_s
                if wakeup is not None:
                    wait = max(0.0, min(wait, wakeup - self.loop.clock()))
                self.last_error = None
            except Fenced as exc:
                # Another server leads: not one more decision from this one.
                log.error("%s", exc)
                self.fenced = True
                self.last_error = str(exc)
                return
            except Exception as exc:  # one bad turn must not stop the scheduler
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("control loop turn failed; rebuilding from the store")
                self.loop.invalidate()
                next_reconcile = 0.0
            self.turns += 1
            self._woken.wait(wait)
