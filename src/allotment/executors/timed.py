"""An executor that runs nothing: each replica "runs" for a fixed time, then exits 0.

For benchmarks of the live system (API, store, control loop) without the cost of real
processes, as Kueue's own scheduler-performance harness does. A replica's runtime is read
from its launch request's environment, ``ALLOTMENT_SIM_RUNTIME_S`` (seconds, a float;
a job file sets it under ``env``), or is ``default_runtime_s``. It is ``running`` from
its launch until ``start + runtime``, then ``exited`` with code 0 and ``ended_at =
start + runtime``. :meth:`TimedExecutor.stop` ends a running replica at once as
``killed`` by SIGTERM (``stop_requested``). Times come from the injected ``clock``. Told
where (:meth:`TimedExecutor.wake_on_end`), it sends ``wake`` at each replica's end, as
the local executor's supervisors do.
"""

from __future__ import annotations

import heapq
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from allotment.executors.base import (
    Executor,
    GpuInfo,
    LaunchRequest,
    ReplicaKey,
    ReplicaPhase,
    ReplicaStatus,
)
from allotment.executors.supervisor import send_wake

RUNTIME_ENV = "ALLOTMENT_SIM_RUNTIME_S"
"""Environment variable of a launch request that holds the simulated runtime (seconds)."""

DEFAULT_RUNTIME_S = 1.0


@dataclass(slots=True)
class _Replica:
    started_at: float
    runtime: float
    stopped_at: float | None = None
    ended: ReplicaStatus | None = None
    """The final status, once it has ended (it never changes again)."""


def runtime_of(request: LaunchRequest, default: float) -> float:
    """The simulated runtime of ``request``: ``ALLOTMENT_SIM_RUNTIME_S`` if it is set to a
    finite, non-negative number, else ``default``."""
    text = request.env.get(RUNTIME_ENV)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    if value != value or value < 0 or value == float("inf"):
        return default
    return value


class TimedExecutor(Executor):
    """Replicas that end on their own after their runtime; nothing is started.

    ``clock`` returns seconds since the epoch (the control loop's clock);
    ``devices`` is what :meth:`inventory` reports. Safe to call from several threads.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        default_runtime_s: float = DEFAULT_RUNTIME_S,
        devices: Sequence[GpuInfo] = (),
    ) -> None:
        if default_runtime_s < 0:
            raise ValueError("default_runtime_s must not be negative")
        self.clock = clock
        self.default_runtime_s = default_runtime_s
        self._devices = list(devices)
        self._replicas: dict[ReplicaKey, _Replica] = {}
        self._lock = threading.Condition()
        self._ends: list[float] = []
        """When replicas end, for :meth:`wake_on_end` (a heap)."""
        self._wake_to: tuple[int, str] | None = None
        self.launches = 0
        """Replicas launched (repeats of a launch not counted)."""

    def launch(self, request: LaunchRequest) -> str:
        key = request.key
        with self._lock:
            if key not in self._replicas:
                replica = self._replicas[key] = _Replica(
                    started_at=self.clock(),
                    runtime=runtime_of(request, self.default_runtime_s),
                )
                self.launches += 1
                if self._wake_to is not None:
                    heapq.heappush(self._ends, replica.started_at + replica.runtime)
                    self._lock.notify()
        return str(key)

    def wake_on_end(self, port: int, secret: str) -> None:
        with self._lock:
            first = self._wake_to is None
            self._wake_to = (port, secret)
        if first:
            threading.Thread(target=self._ending, name="timed-ends", daemon=True).start()

    def _ending(self) -> None:
        """Send ``wake`` as replicas end (their runtime's end; a stop is seen anyway)."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while True:
                with self._lock:
                    while not self._ends or self._ends[0] > self.clock():
                        wait = None if not self._ends else self._ends[0] - self.clock()
                        self._lock.wait(wait)
                    while self._ends and self._ends[0] <= self.clock():
                        heapq.heappop(self._ends)
                    assert self._wake_to is not None
                    port, secret = self._wake_to
                send_wake(sock, port, secret)

    def stop(self, key: ReplicaKey, grace_s: float) -> None:
        with self._lock:
            replica = self._replicas.get(key)
            if replica is None or replica.stopped_at is not None:
                return
            now = self.clock()
            if now >= replica.started_at + replica.runtime:
                return  # it has already exited on its own
            replica.stopped_at = now

    def observe(self) -> dict[ReplicaKey, ReplicaStatus]:
        with self._lock:
            now = self.clock()
            return {key: r.ended or _status(r, now) for key, r in self._replicas.items()}

    def inventory(self) -> list[GpuInfo]:
        return list(self._devices)


def _status(replica: _Replica, now: float) -> ReplicaStatus:
    """The replica's status at ``now``; an ending is remembered on the replica."""
    end = replica.started_at + replica.runtime
    if replica.stopped_at is not None:
        replica.ended = ReplicaStatus(
            phase=ReplicaPhase.KILLED,
            started_at=replica.started_at,
            ended_at=replica.stopped_at,
            signal=int(signal.SIGTERM),
            stop_requested=True,
        )
        return replica.ended
    if now >= end:
        replica.ended = ReplicaStatus(
            phase=ReplicaPhase.EXITED,
            started_at=replica.started_at,
            ended_at=end,
            exit_code=0,
        )
        return replica.ended
    return ReplicaStatus(phase=ReplicaPhase.RUNNING, started_at=replica.started_at)
