"""The service controller: keeps every service's replicas running, healthy, as many as
its load asks for, and on its newest spec.

On the leading server, on a thread of its own, every ``tick_s``:

1. **Health.** Each running replica is probed (``GET`` its health path on its port,
   concurrently, each within the check's timeout) when its interval is due. A replica
   takes traffic after its first pass; once ready, ``failure_threshold`` failures in
   a row stop it (it is restarted); one never ready ``start_timeout`` after it started
   is stopped too.
2. **Restarts.** A replica job that ended by itself (killed, crashed, failed its
   health check, its node lost) is replaced by a new replica job at once, not to
   start before the back-off of the service's failures in a row (the scheduler gives
   it the reason ``backoff`` meanwhile). A replica that becomes ready resets the count;
   after ``crash_loop_after`` failures in a row the service's reason is ``crash_loop``.
3. **Scale.** The replicas wanted follow the requests in flight that the proxy
   measured (:class:`ServiceTraffic`), between the spec's ``min`` and ``max``
   (:func:`~allotment.domain.service.desired_replicas`). A new replica is an ordinary
   job: quota, priority and borrowing hold, and while it waits the service's reason
   names it and its reason (``allot why`` on it says more). Scaling down cancels a
   replica job, so its GPUs are free at the next turn.
4. **Rolling update.** After a spec changes (a new generation) new replicas are
   started; old ones are stopped only as new ones become ready, so the ready count
   never drops below what is wanted because of the update.

A ready replica stopped on purpose (scaled down, replaced by a new generation) is
drained first: it takes no new requests at once, and its job is cancelled
:data:`DRAIN_S` later, so that requests already sent to it are answered. One that
failed its checks is stopped at once.

Every decision about one service is written in one transaction with the service row
locked, so a deletion through the API never races with a new replica. Replica jobs
are created and cancelled through the store's one job mutator; the loop is woken to
place or stop them.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.durations import format_duration
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import ALLOWED, TERMINAL, JobState
from allotment.domain.reasons import ReasonCode
from allotment.domain.service import ServiceSettings, desired_replicas, load_wants
from allotment.store.jobs import cancel_job, jobs_by_id
from allotment.store.models import Job, Service
from allotment.store.services import add_replica, replica_jobs, settings_of

log = logging.getLogger(__name__)

DRAIN_S = 2.0
"""How long a ready replica stopped on purpose gets no new requests before its job is
cancelled (the proxy's view of the ready replicas is at most a quarter second old)."""

DEFAULT_TICK_S = 0.5
REPLICA_HOST = "127.0.0.1"
"""Where replicas listen: the executors run them on this machine's nodes."""
CONTROLLER = "the service controller"


def free_port() -> int:
    """A TCP port nothing listens on now, for a new replica."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((REPLICA_HOST, 0))
        return int(sock.getsockname()[1])


def replica_url(record: dict[str, Any], path: str = "/") -> str:
    return f"http://{REPLICA_HOST}:{record['port']}{path}"


# ---------------------------------------------------------------- traffic


@dataclass
class _Gauge:
    in_flight: int = 0
    area: float = 0.0
    since: float = 0.0

    def advance(self, now: float) -> None:
        self.area += self.in_flight * max(0.0, now - self.since)
        self.since = now


class ServiceTraffic:
    """Requests in flight per service, as the proxy counts them (a request counts from
    its arrival, waiting for a replica included, to its response's last byte). The
    controller reads the time-weighted average. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._gauges: dict[str, _Gauge] = {}

    def begin(self, service_id: str) -> None:
        self._move(service_id, +1)

    def end(self, service_id: str) -> None:
        self._move(service_id, -1)

    def _move(self, service_id: str, by: int) -> None:
        now = self._clock()
        with self._lock:
            gauge = self._gauges.setdefault(service_id, _Gauge(since=now))
            gauge.advance(now)
            gauge.in_flight = max(0, gauge.in_flight + by)

    def levels(self) -> dict[str, int]:
        """The requests in flight now, per service counted so far."""
        with self._lock:
            return {service: gauge.in_flight for service, gauge in self._gauges.items()}

    def level(self, service_id: str, in_flight: int) -> None:
        """Set the requests in flight from another count of them (the proxy's, in
        another process), correcting one a lost message left wrong."""
        now = self._clock()
        with self._lock:
            gauge = self._gauges.setdefault(service_id, _Gauge(since=now))
            gauge.advance(now)
            gauge.in_flight = max(0, in_flight)

    def take(self, service_id: str) -> tuple[float, float, int]:
        """``(area, now, in_flight)``: request-seconds since the last take, and the
        requests in flight now."""
        now = self._clock()
        with self._lock:
            gauge = self._gauges.setdefault(service_id, _Gauge(since=now))
            gauge.advance(now)
            area, gauge.area = gauge.area, 0.0
            return area, now, gauge.in_flight


@dataclass
class _Load:
    """A service's recent load: ``(at, request-seconds, seconds)`` over the window."""

    samples: deque[tuple[float, float, float]] = field(default_factory=deque)
    last_at: float | None = None
    last_needed_more: float = 0.0

    def add(self, area: float, now: float, window: float) -> float:
        if self.last_at is not None and now > self.last_at:
            self.samples.append((now, area, now - self.last_at))
        self.last_at = now
        while self.samples and self.samples[0][0] < now - window:
            self.samples.popleft()
        seconds = sum(s[2] for s in self.samples)
        return sum(s[1] for s in self.samples) / seconds if seconds > 0 else 0.0


# ---------------------------------------------------------------- health


@dataclass
class _Health:
    failures: int = 0
    """Failed probes in a row."""
    passed: bool = False
    last_probe: float = -1e18


def probe(url: str, timeout: float) -> bool:
    """One health check: an answer below 400 within ``timeout``."""
    try:
        response = httpx.get(url, timeout=timeout)
    except httpx.HTTPError:
        return False
    return response.status_code < 400


# ---------------------------------------------------------------- controller


ROOM_REASONS = frozenset(
    {ReasonCode.QUOTA_EXHAUSTED, ReasonCode.NO_NODE_FITS, ReasonCode.BEHIND_HIGHER_PRIORITY}
)
"""A waiting job's reasons that say there is no room for it now (not its back-off, a
time window, or a preemption already under way)."""


def _unplaced(job: Job | None) -> bool:
    """Whether ``job`` waits for room."""
    return (
        job is not None and job.state == JobState.PENDING.value and job.reason_code in ROOM_REASONS
    )


class ServiceController:
    """Runs the service controller on ``sessions`` (the leader's fenced sessions) until
    :meth:`stop`; ``wake`` asks the control loop for a turn."""

    def __init__(
        self,
        sessions: sessionmaker[DbSession],
        *,
        traffic: ServiceTraffic,
        clock: Callable[[], float] = time.time,
        wake: Callable[[], None] = lambda: None,
        tick_s: float = DEFAULT_TICK_S,
        probe: Callable[[str, float], bool] = probe,
        free_port: Callable[[], int] = free_port,
    ) -> None:
        self.sessions = sessions
        self.traffic = traffic
        self.clock = clock
        self.wake = wake
        self.tick_s = tick_s
        self._probe = probe
        self._free_port = free_port
        self._health: dict[str, _Health] = {}
        self._loads: dict[str, _Load] = {}
        self._last_failure: dict[str, str] = {}
        """Each service's last replica failure class, for its ``crash_loop`` reason."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="allot-probe")

    # -- lifecycle (a loop companion)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="allot-services", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except Exception:
                log.exception("service controller step failed; the next one goes on")
            self._stopping.wait(self.tick_s)

    # -- one step

    def step(self) -> bool:
        """Probe, then reconcile every service; return whether a replica job was made
        or stopped (the loop was woken)."""
        with self.sessions() as db:
            rows = list(db.scalars(select(Service)))
            services = [(s.id, list(s.replicas)) for s in rows]
            specs = {s.id: settings_of(s) for s in rows}
            ids = [r["job"] for _, replicas in services for r in replicas]
            states = {job.id: job.state for job in jobs_by_id(db, ids)}
        self._probe_due(services, states, specs)
        live_jobs = set(ids)
        for gone in set(self._health) - live_jobs:
            del self._health[gone]
        for kept in (self._loads, self._last_failure):
            for gone in set(kept) - {sid for sid, _ in services}:
                del kept[gone]
        changed = False
        for service_id, _ in services:
            with self.sessions.begin() as db:
                found = db.scalars(
                    select(Service).where(Service.id == service_id).with_for_update()
                ).first()
                if found is not None:
                    changed = self._reconcile(db, found) or changed
        if changed:
            self.wake()
        return changed

    def _probe_due(
        self,
        services: list[tuple[str, list[dict[str, Any]]]],
        states: dict[str, str],
        specs: dict[str, JobSpec],
    ) -> None:
        now = self.clock()
        due: list[tuple[str, str, float]] = []
        for service_id, replicas in services:
            spec = specs.get(service_id)
            if spec is None or spec.service is None:
                continue
            check = spec.service.health
            for record in replicas:
                job = record["job"]
                if states.get(job) != JobState.RUNNING.value or record.get("retired"):
                    continue
                health = self._health.setdefault(job, _Health())
                if now - health.last_probe >= check.interval or not health.passed:
                    health.last_probe = now
                    due.append((job, replica_url(record, check.path), check.timeout))
        results = list(self._pool.map(lambda d: self._probe(d[1], d[2]), due))
        for (job, _, _), ok in zip(due, results, strict=True):
            health = self._health[job]
            health.failures = 0 if ok else health.failures + 1
            health.passed = health.passed or ok

    def _reconcile(self, db: DbSession, service: Service) -> bool:
        now = self.clock()
        spec = settings_of(service)
        settings = spec.service
        assert settings is not None
        jobs = replica_jobs(db, service)
        records: list[dict[str, Any]] = []
        acted = False
        last_failure: Job | None = None
        for record in service.replicas:
            record = dict(record)
            job = jobs.get(record["job"])
            state = JobState(job.state) if job is not None else JobState.FAILED
            if job is None or state in TERMINAL or state is JobState.FAILED:
                if state is JobState.RECLAIMED:
                    # Reaped for idleness or its time to live: one replica fewer.
                    service.desired = max(settings.replicas.min, service.desired - 1)
                elif not record.get("retired"):
                    last_failure = job
                    self._failed(service, settings, now)
                continue
            drain_until = record.get("drain_until")
            if drain_until is not None:
                if now >= drain_until:  # drained: its job is cancelled now
                    del record["drain_until"]
                    self._cancel(db, service, record, now)
                    acted = True
            elif record.get("retired"):
                pass  # stopping: no health checks, no traffic
            elif state is JobState.RUNNING:
                record["started"] = record.get("started") or now
                acted = self._check_health(db, service, settings, record, now) or acted
            elif record.get("ready"):  # preempted and requeued: no traffic until it is back
                record["ready"] = False
                record["started"] = None
                self._health.pop(record["job"], None)
            records.append(record)
        service.desired = self._wanted(service, settings, now)
        acted = self._scale(db, service, settings, records, jobs, now) or acted
        self._set_reason(service, settings, records, jobs, last_failure, now)
        if records != service.replicas:
            service.replicas = records
            service.updated_at = now
        return acted

    def _failed(self, service: Service, settings: ServiceSettings, now: float) -> None:
        service.failures += 1
        service.restarts += 1
        service.next_start_at = now + settings.restart.delay(service.failures)

    def _check_health(
        self,
        db: DbSession,
        service: Service,
        settings: ServiceSettings,
        record: dict[str, Any],
        now: float,
    ) -> bool:
        """Record readiness; stop a replica that failed its checks. Return whether one
        was stopped."""
        check = settings.health
        health = self._health.get(record["job"], _Health())
        if health.passed and health.failures == 0:
            if not record.get("ready"):
                record["ready"] = True
                service.failures = 0
                service.next_start_at = None
            return False
        why = None
        if record.get("ready") and health.failures >= check.failure_threshold:
            why = f"its health check failed {health.failures} times in a row"
        elif not record.get("ready") and now - record["started"] > check.start_timeout:
            why = f"not ready {format_duration(check.start_timeout)} after it started"
        if record.get("ready") and health.failures:
            record["ready"] = health.failures < check.failure_threshold
        if why is None:
            return False
        self._retire(db, service, record, because=why, now=now)
        self._failed(service, settings, now)
        return True

    def _retire(
        self,
        db: DbSession,
        service: Service,
        record: dict[str, Any],
        *,
        because: str,
        now: float,
        drain: bool = False,
    ) -> None:
        """Stop one replica job on purpose (scale down, roll over, unhealthy); with
        ``drain``, a ready one takes no new requests now and is cancelled
        :data:`DRAIN_S` later."""
        record["retired"] = True
        record["because"] = because
        if drain and record.get("ready"):
            record["ready"] = False
            record["drain_until"] = now + DRAIN_S
            return
        record["ready"] = False
        self._cancel(db, service, record, now)

    def _cancel(self, db: DbSession, service: Service, record: dict[str, Any], now: float) -> None:
        job = db.get(Job, record["job"])
        if job is not None and JobState.CANCELLED in ALLOWED[JobState(job.state)]:
            why = record.get("because", "stopped")
            cancel_job(db, job.id, at=now, by=f"{CONTROLLER} ({service.name}: {why})")

    def _wanted(self, service: Service, settings: ServiceSettings, now: float) -> int:
        """The replicas the service's load asks for now (its average over the window,
        or the requests in flight now when more: a burst scales up at once)."""
        load = self._loads.setdefault(service.id, _Load(last_needed_more=now))
        area, at, in_flight = self.traffic.take(service.id)
        judged = max(load.add(area, at, settings.autoscaling.window), float(in_flight))
        if load_wants(settings, judged) >= service.desired:
            load.last_needed_more = now
        return desired_replicas(
            settings,
            current=service.desired,
            in_flight=judged,
            now=now,
            last_needed_more=load.last_needed_more,
        )

    def _scale(
        self,
        db: DbSession,
        service: Service,
        settings: ServiceSettings,
        records: list[dict[str, Any]],
        jobs: dict[str, Job],
        now: float,
    ) -> bool:
        """Start replicas of the newest generation up to ``service.desired`` (the first
        ``min`` of them never preempted, those above preemptible whatever their class);
        stop its surplus (those not ready first, then those above the minimum, then the
        newest) and the older generations' replicas that ready new ones replace. When a
        new replica cannot be placed (its queue's quota or the nodes are full) and
        nothing is stopping yet, one more old replica is stopped to make room: an update
        never waits forever on the room its own old replicas hold. Return whether any
        job changed."""
        wanted = service.desired
        live = [r for r in records if not r.get("retired")]
        new = [r for r in live if r["generation"] == service.generation]
        old = [r for r in live if r["generation"] != service.generation]
        not_before = service.next_start_at
        if not_before is not None and not_before <= now:
            not_before = None
        protected = sum(1 for r in new if not r.get("preemptible"))
        for _ in range(wanted - len(new)):
            record = add_replica(
                db,
                service,
                port=self._free_port(),
                at=now,
                not_before=not_before,
                preemptible=protected >= settings.replicas.min,
            )
            protected += not record["preemptible"]
            records.append(record)
        # Kept first: ready ones, those of the minimum before those above it, the oldest
        # (records are in the order they were made).
        by_value = sorted(new, key=lambda r: (not r.get("ready"), bool(r.get("preemptible"))))
        for record in by_value[wanted:]:
            self._retire(db, service, record, because="scaled down", now=now, drain=True)
        kept = by_value[:wanted]
        keep_old = max(0, wanted - sum(1 for r in kept if r.get("ready")))
        stopping = any(r.get("retired") for r in records)
        if old and not stopping and any(_unplaced(jobs.get(r["job"])) for r in kept):
            keep_old = min(keep_old, len(old) - 1)
        old.sort(key=lambda r: not r.get("ready"))
        for record in old[keep_old:]:
            because = f"replaced by generation {service.generation}"
            self._retire(db, service, record, because=because, now=now, drain=True)
        return wanted != len(new) or len(old) > keep_old

    def _set_reason(
        self,
        service: Service,
        settings: ServiceSettings,
        records: list[dict[str, Any]],
        jobs: dict[str, Job],
        last_failure: Job | None,
        now: float,
    ) -> None:
        live = [r for r in records if not r.get("retired")]
        ready = sum(1 for r in live if r.get("ready"))
        code, message = "ready", f"{ready} of {service.desired} replicas ready"
        if service.failures >= settings.restart.crash_loop_after:
            code = "crash_loop"
            message = f"{service.failures} replica failures in a row, none became ready"
            if last_failure is not None and last_failure.failure_class:
                self._last_failure[service.id] = last_failure.failure_class
            if service.id in self._last_failure:
                message += f" (the last ended {self._last_failure[service.id]})"
            if service.next_start_at is not None and service.next_start_at >= now + 1:
                wait = format_duration(service.next_start_at - now)
                message += f"; next start in {wait}"
        elif ready < service.desired:
            waiting = [r for r in live if not r.get("ready")]
            code = "scaling"
            message = f"{ready} of {service.desired} replicas ready"
            job = jobs.get(waiting[0]["job"]) if waiting else None
            if job is not None and job.state in (JobState.PENDING.value, JobState.SUBMITTED.value):
                said = job.reason_message or job.reason_code or "not placed yet"
                message += f"; replica job {job.id} waits: {said}"
            elif job is not None:
                message += f"; replica job {job.id} is {job.state}, not ready yet"
        if (code, message) != (service.reason_code, service.reason_message):
            service.reason_code, service.reason_message = code, message
