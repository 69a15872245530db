"""One scheduler per store: run the control loop only while holding the leader lock.

Several servers may serve the API on one store; only the holder of the leader lock
(:func:`~allotment.control.leader.acquire_leadership`) runs a
:class:`~allotment.control.runner.LoopRunner`. The others try again every ``poll_s``
and take over when the leader goes away (its process ends, or on PostgreSQL its
connection dies); a leader whose lock is lost stops its runner at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine

from allotment.control.leader import Leadership, acquire_leadership
from allotment.control.runner import LoopRunner

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 2.0


class LeaderElection:
    """Start a runner from ``make_runner`` whenever this process becomes the leader.

    ``make_runner`` is called once per leadership term (a runner starts only once).
    ``on_change(leading)`` is told of every change. :meth:`start` tries at once, so a
    process that finds the lock free leads before :meth:`start` returns.
    """

    def __init__(
        self,
        engine: Engine,
        make_runner: Callable[[], LoopRunner],
        *,
        poll_s: float = DEFAULT_POLL_S,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.engine = engine
        self.make_runner = make_runner
        self.poll_s = poll_s
        self.on_change = on_change
        self.runner: LoopRunner | None = None
        self._leadership: Leadership | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def leading(self) -> bool:
        return self.runner is not None

    def wake(self) -> None:
        """Wake the runner, if this process leads. Never blocks."""
        runner = self.runner
        if runner is not None:
            runner.wake()

    def start(self) -> None:
        self._step()
        self._thread = threading.Thread(target=self._run, name="allotment-leader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the runner (replicas keep running) and give the lock up."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            self._step_down()

    def _run(self) -> None:
        while not self._stopping.wait(self.poll_s):
            try:
                self._step()
            except Exception:  # the store may be briefly unreachable: try again later
                log.exception("leader election step failed")

    def _step(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            if self._leadership is not None:
                fenced = self.runner is not None and self.runner.fenced
                if self._leadership.check() and not fenced:
                    return
                why = "another server took over" if fenced else "lost the leader lock"
                log.warning("%s (%s): stopping the scheduler", why, self._leadership)
                self._step_down()
                return
            leadership = acquire_leadership(self.engine)
            if leadership is None:
                return
            self._leadership = leadership
            self.runner = self.make_runner()
            self.runner.start()
            log.info("leading the scheduler (%s)", leadership.where)
        if self.on_change is not None:
            self.on_change(True)

    def _step_down(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.stop()
        leadership, self._leadership = self._leadership, None
        if leadership is not None:
            leadership.release()
            if self.on_change is not None:
                self.on_change(False)
