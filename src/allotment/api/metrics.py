"""Prometheus metrics at ``GET /metrics``, read from the store at scrape time.

:class:`StoreCollector` answers each scrape with a few aggregate queries, so every
server on a store shows the same numbers and a restart loses none:

- ``allot_jobs{state,tenant,queue}`` — jobs by state (gauge).
- ``allot_queue_quota_gpus{queue,tenant,pool,kind}`` — ``nominal``, ``used`` and
  ``borrowed`` GPUs of each queue's subtree, as ``GET /api/v1/queues`` shows them.
- ``allot_gpu_utilization{node,device}`` (ratio 0-1) and ``allot_gpu_memory_bytes`` —
  each device's latest sampled interval, when it ended within :data:`FRESH_S`.
- ``allot_alerts_total{kind,tenant}`` — alerts fired; ``allot_alert_deliveries{tenant,
  state}`` — their webhook deliveries by state (``pending``, ``delivered``, ``failed``,
  ``none``).
- ``allot_preemptions_total{queue}`` and ``allot_reclaims_total{reason}`` (the
  ``reason`` of the event's detail, else ``unknown``) — counted from the jobs' state
  transitions; ``allot_job_wait_seconds{queue}`` — a histogram of each admission's wait,
  from the job's latest move to ``pending`` (its submission, or its requeue) to its
  admission. These three are read incrementally (events after the last one counted)
  and only from events older than ``settle_s``, so that a transaction still open when
  a later one committed is not skipped (PostgreSQL hands out ids before commit).

``allot_scheduler_cycle_seconds`` is process-local: the cycles of this server's
control loop (:data:`allotment.control.runner.CYCLE_SECONDS`).

Labels are tenants, queues, pools, nodes, states, kinds and reasons, never job ids or
names. Reading ``/metrics`` needs a platform admin's token (Prometheus:
``authorization: {credentials: <token>}``), since it spans every tenant.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased, sessionmaker

from allotment.api import fleet, schemas
from allotment.api.access import allowed
from allotment.api.auth import Principal
from allotment.api.policy import Action
from allotment.control.runner import CYCLE_SECONDS
from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import JobState
from allotment.store.jobs import TRANSITION
from allotment.store.models import Alert, DeviceUsage, Event, Job

WAIT_BUCKETS: tuple[float, ...] = (
    1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 43200,
    86400, 172800, 345600, 604800,
)  # fmt: skip
"""Upper bounds of ``allot_job_wait_seconds``, from a second to a week."""

FRESH_S = 900.0
"""A device interval that ended longer ago than this is no longer shown (intervals are
taken to be shorter than this)."""

DEFAULT_SETTLE_S = 5.0


def _bound(value: float) -> str:
    """A bucket's ``le`` as Prometheus writes it (``60.0``, ``+Inf``)."""
    return "+Inf" if value == float("inf") else repr(float(value))


_COUNTED = (JobState.ADMITTED.value, JobState.PREEMPTED.value, JobState.RECLAIMED.value)


class EventTally:
    """Counts of transitions, kept up to date by reading only the events after the last
    one counted. Thread-safe."""

    def __init__(self, *, settle_s: float = DEFAULT_SETTLE_S) -> None:
        self.settle_s = settle_s
        self.last_id = 0
        self.preemptions: dict[str, int] = defaultdict(int)
        self.reclaims: dict[str, int] = defaultdict(int)
        self.wait_buckets: dict[str, list[int]] = {}
        """Per queue: how many waits fell in each bucket (not cumulative; one more for
        ``+Inf``)."""
        self.wait_sum: dict[str, float] = defaultdict(float)
        self.lock = threading.Lock()

    def update(self, db: Session, *, now: float) -> None:
        """Count the transition events after :attr:`last_id` that are older than
        ``settle_s``."""
        entered = aliased(Event)
        since = (
            select(func.max(entered.at))
            .where(
                entered.job_id == Event.job_id,
                entered.kind == TRANSITION,
                entered.to_state == JobState.PENDING.value,
                entered.id < Event.id,
            )
            .scalar_subquery()
        )
        query = (
            select(Event.id, Event.at, Event.to_state, Event.detail, Job.queue, since)
            .join(Job, Job.id == Event.job_id)
            .where(
                Event.id > self.last_id,
                Event.kind == TRANSITION,
                Event.to_state.in_(_COUNTED),
                Event.at <= now - self.settle_s,
            )
            .order_by(Event.id)
        )
        for event_id, at, state, detail, queue, entered_at in db.execute(query).tuples():
            if state == JobState.PREEMPTED.value:
                self.preemptions[queue] += 1
            elif state == JobState.RECLAIMED.value:
                reason = (detail or {}).get("reason")
                self.reclaims[str(reason) if reason else "unknown"] += 1
            elif entered_at is not None:
                wait = max(0.0, at - entered_at)
                buckets = self.wait_buckets.setdefault(queue, [0] * (len(WAIT_BUCKETS) + 1))
                buckets[bisect.bisect_left(WAIT_BUCKETS, wait)] += 1
                self.wait_sum[queue] += wait
            self.last_id = max(self.last_id, event_id)

    def wait_histogram(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "allot_job_wait_seconds",
            "Seconds from a job's submission or requeue to its admission.",
            labels=["queue"],
        )
        for queue, counts in sorted(self.wait_buckets.items()):
            cumulative: list[tuple[str, float]] = []
            total = 0
            for bound, count in zip((*WAIT_BUCKETS, float("inf")), counts, strict=True):
                total += count
                cumulative.append((_bound(bound), total))
            family.add_metric([queue], cumulative, self.wait_sum[queue])
        return family


class StoreCollector(Collector):
    """The store's metrics, read at each scrape (see the module's docstring)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        cluster: Callable[[], Cluster],
        *,
        clock: Callable[[], float] = time.time,
        settle_s: float = DEFAULT_SETTLE_S,
    ) -> None:
        self.sessions = sessions
        self.cluster = cluster
        self.clock = clock
        self.tally = EventTally(settle_s=settle_s)

    def describe(self) -> list[Metric]:
        return []  # registering must not query the store

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        with self.sessions() as db:
            yield self._jobs(db)
            yield self._quota(db)
            yield from self._devices(db, now)
            yield from self._alerts(db)
            with self.tally.lock:
                self.tally.update(db, now=now)
                yield from self._counters()
                yield self.tally.wait_histogram()

    def _jobs(self, db: Session) -> Metric:
        family = GaugeMetricFamily(
            "allot_jobs", "Jobs by state.", labels=["state", "tenant", "queue"]
        )
        query = select(Job.state, Job.tenant, Job.queue, func.count()).group_by(
            Job.state, Job.tenant, Job.queue
        )
        for state, tenant, queue, count in db.execute(query).tuples():
            family.add_metric([state, tenant, queue], count)
        return family

    def _quota(self, db: Session) -> Metric:
        family = GaugeMetricFamily(
            "allot_queue_quota_gpus",
            "GPUs of a queue's subtree in a pool: nominal quota, used, and borrowed.",
            labels=["queue", "tenant", "pool", "kind"],
        )
        tree = fleet.queue_tree(self.cluster(), fleet.Usage(db, count_pending=False))
        stack = list(tree.queues)
        while stack:
            queue: schemas.QueueUsageOut = stack.pop()
            stack.extend(queue.children)
            for pool, usage in sorted(queue.usage.items()):
                for kind in ("nominal", "used", "borrowed"):
                    amount = getattr(usage, kind)
                    family.add_metric([queue.name, queue.tenant or "", pool, kind], amount)
        return family

    def _devices(self, db: Session, now: float) -> Iterator[Metric]:
        utilisation = GaugeMetricFamily(
            "allot_gpu_utilization",
            "A device's average utilisation (0-1) over its latest sampled interval.",
            labels=["node", "device"],
        )
        memory = GaugeMetricFamily(
            "allot_gpu_memory_bytes",
            "A device's most memory in use over its latest sampled interval.",
            labels=["node", "device"],
        )
        latest = (
            select(
                DeviceUsage.node,
                DeviceUsage.device,
                func.max(DeviceUsage.interval_start).label("start"),
            )
            .where(DeviceUsage.interval_start >= now - 2 * FRESH_S)
            .group_by(DeviceUsage.node, DeviceUsage.device)
            .subquery()
        )
        query = select(
            DeviceUsage.node,
            DeviceUsage.device,
            DeviceUsage.interval_start + DeviceUsage.interval_s,
            DeviceUsage.util_avg,
            DeviceUsage.memory_max,
        ).join(
            latest,
            and_(
                DeviceUsage.node == latest.c.node,
                DeviceUsage.device == latest.c.device,
                DeviceUsage.interval_start == latest.c.start,
            ),
        )
        for node, device, end, util, used in db.execute(query).tuples():
            if end < now - FRESH_S:
                continue
            labels = [node, str(device)]
            if util is not None:
                utilisation.add_metric(labels, util / 100.0)
            if used is not None:
                memory.add_metric(labels, float(used))
        yield utilisation
        yield memory

    def _alerts(self, db: Session) -> Iterator[Metric]:
        fired = CounterMetricFamily(
            "allot_alerts", "Alerts fired, by kind and tenant.", labels=["kind", "tenant"]
        )
        deliveries = GaugeMetricFamily(
            "allot_alert_deliveries",
            "Alerts by the state of their webhook delivery.",
            labels=["tenant", "state"],
        )
        fired_by: dict[tuple[str, str], int] = defaultdict(int)
        query = select(Alert.kind, Alert.tenant, Alert.delivery, func.count()).group_by(
            Alert.kind, Alert.tenant, Alert.delivery
        )
        states: dict[tuple[str, str], int] = defaultdict(int)
        for kind, tenant, delivery, count in db.execute(query).tuples():
            fired_by[(kind, tenant or "")] += count
            states[(tenant or "", delivery)] += count
        for labels, count in sorted(fired_by.items()):
            fired.add_metric(list(labels), count)
        for labels, count in sorted(states.items()):
            deliveries.add_metric(list(labels), count)
        yield fired
        yield deliveries

    def _counters(self) -> Iterator[Metric]:
        preemptions = CounterMetricFamily(
            "allot_preemptions", "Jobs preempted, by their queue.", labels=["queue"]
        )
        for queue, count in sorted(self.tally.preemptions.items()):
            preemptions.add_metric([queue], count)
        reclaims = CounterMetricFamily(
            "allot_reclaims", "Jobs reclaimed, by reason.", labels=["reason"]
        )
        for reason, count in sorted(self.tally.reclaims.items()):
            reclaims.add_metric([reason], count)
        yield preemptions
        yield reclaims


def metrics_registry(
    sessions: sessionmaker[Session],
    cluster: Callable[[], Cluster],
    *,
    clock: Callable[[], float] = time.time,
    settle_s: float = DEFAULT_SETTLE_S,
) -> CollectorRegistry:
    """A registry with the store's metrics and this process's cycle durations."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(sessions, cluster, clock=clock, settle_s=settle_s))
    registry.register(CYCLE_SECONDS)
    return registry


router = APIRouter()

MetricsReader = Annotated[Principal, Depends(allowed(Action.METRICS_READ))]


@router.get("/metrics", response_class=Response, include_in_schema=False)
def metrics(request: Request, _: MetricsReader) -> Response:
    """The Prometheus text exposition of :func:`metrics_registry`."""
    registry: Any = request.app.state.metrics
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
