"""``max_wait`` alerts: a job that waits longer than its queue allows fires one alert.

A job *waits* from the moment it may start: its submission, or — when it went back to
``pending`` after an attempt (preempted, or retried) — the end of that attempt, or its
``not_before`` (a retry's back-off) when that is later. Its limit is the ``max_wait`` of
its queue, else of the nearest ancestor that sets one; a job in a queue without one is
never alerted.

A job that has waited past its limit gets exactly one alert per wait: a row in
``alerts`` (kind ``max_wait``, dedupe key ``max_wait:<job>:<attempt>``, where
``<attempt>`` is the number of attempts the job had made when this wait began, 0 for
the first), an ``alert`` event on the job, and, when its tenant configured a
``webhook``, a webhook delivery for :mod:`allotment.upkeep.webhooks`. The insert
ignores a dedupe key that exists, so checking twice, on two servers or after a
restart, fires nothing new. Being admitted in time fires nothing; a requeued job may
fire again for its new wait.

The check is one query: waiting jobs of queues with a limit, waiting since before
``now - max_wait``, without an alert for their current wait; it fires at most
:data:`MAX_PER_CHECK` alerts (earliest submitted first) and writes only rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import String, and_, cast, exists, func, literal, or_, select
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.cluster import Cluster
from allotment.domain.durations import format_duration
from allotment.domain.lifecycle import WAITING
from allotment.store.alerts import NewAlert, fire_alert
from allotment.store.models import Alert, Attempt, Job

log = logging.getLogger(__name__)

MAX_WAIT = "max_wait"
"""Alert kind."""

DEFAULT_CHECK_EVERY_S = 1.0

MAX_PER_CHECK = 100
"""Most alerts one check fires, so that a backlog overdue at once (after a long
outage, or a lowered ``max_wait``) never holds a turn up long; the rest fire at the
next checks, earliest submitted first."""


def max_waits(cluster: Cluster) -> dict[str, float]:
    """Each leaf queue's limit: its own ``max_wait``, else its nearest ancestor's;
    leaves without one are left out."""
    limits: dict[str, float] = {}
    for leaf in cluster.leaves:
        limit = leaf.inherited(lambda q: q.max_wait)
        if limit is not None:
            limits[leaf.name] = limit
    return limits


def dedupe_key(job_id: str, attempt: int) -> str:
    """The key that makes a job's ``max_wait`` alert fire once per wait."""
    return f"{MAX_WAIT}:{job_id}:{attempt}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Overdue:
    """A waiting job past its limit."""

    job: str
    name: str
    tenant: str
    queue: str
    attempt: int
    since: float
    limit: float
    reason_code: str | None
    reason_message: str | None


def overdue_jobs(
    db: DbSession, cluster: Cluster, *, now: float, limit_rows: int = MAX_PER_CHECK
) -> list[Overdue]:
    """Waiting jobs past their queue's limit and not yet alerted for this wait, in
    submission order, at most ``limit_rows``. One query; reads only."""
    by_limit: dict[float, list[str]] = defaultdict(list)
    limits = max_waits(cluster)
    for queue, limit in limits.items():
        by_limit[limit].append(queue)
    if not by_limit:
        return []
    key = literal(f"{MAX_WAIT}:") + Job.id + literal(":") + cast(Job.attempt, String)
    greatest = func.greatest if db.get_bind().dialect.name == "postgresql" else func.max
    since = greatest(
        Job.submit_time,
        func.coalesce(Attempt.end_time, Job.submit_time),
        func.coalesce(Job.not_before, Job.submit_time),
    )
    query = (
        select(
            Job.id,
            Job.name,
            Job.tenant,
            Job.queue,
            Job.attempt,
            Job.submit_time,
            Job.not_before,
            Job.reason_code,
            Job.reason_message,
            Attempt.end_time,
        )
        .outerjoin(Attempt, and_(Attempt.job_id == Job.id, Attempt.number == Job.attempt))
        .where(
            Job.state.in_([s.value for s in WAITING]),
            or_(
                *(
                    and_(
                        Job.queue.in_(sorted(queues)),
                        Job.submit_time <= now - limit,
                        since <= now - limit,
                    )
                    for limit, queues in sorted(by_limit.items())
                )
            ),
            ~exists().where(Alert.dedupe_key == key),
        )
        .order_by(Job.submit_time, Job.id)
        .limit(limit_rows)
    )
    found: list[Overdue] = []
    for row in db.execute(query).tuples():
        job_id, name, tenant, queue, attempt, submitted, not_before, code, message, ended = row
        found.append(
            Overdue(
                job=job_id,
                name=name,
                tenant=tenant,
                queue=queue,
                attempt=attempt,
                since=max(submitted, ended or submitted, not_before or submitted),
                limit=limits[queue],
                reason_code=code,
                reason_message=message,
            )
        )
    return found


def alert_of(job: Overdue, cluster: Cluster, *, now: float) -> NewAlert:
    """The ``max_wait`` alert for ``job``, to its tenant's webhook if it has one."""
    waited = now - job.since
    webhook = cluster.webhook_of(job.tenant)
    return NewAlert(
        kind=MAX_WAIT,
        dedupe_key=dedupe_key(job.job, job.attempt),
        message=(
            f"job {job.job} ({job.name}) has waited {format_duration(waited)} in queue "
            f"{job.queue}, more than its max_wait of {format_duration(job.limit)}"
        ),
        tenant=job.tenant,
        queue=job.queue,
        job_id=job.job,
        detail={
            "job": job.job,
            "name": job.name,
            "queue": job.queue,
            "attempt": job.attempt,
            "waiting_since": job.since,
            "waited_s": round(waited, 3),
            "max_wait_s": job.limit,
            "reason": {"code": job.reason_code, "message": job.reason_message},
        },
        webhook=webhook,
    )


def fire_max_wait_alerts(
    sessions: sessionmaker[DbSession],
    cluster: Cluster,
    *,
    now: float,
    most: int = MAX_PER_CHECK,
) -> list[int]:
    """Fire the ``max_wait`` alerts due at ``now`` (at most ``most``, the earliest
    submitted first), in one transaction; return the ids of the alerts that fired (none
    that had fired before)."""
    fired: list[int] = []
    with sessions.begin() as db:
        for job in overdue_jobs(db, cluster, now=now, limit_rows=most):
            alert_id = fire_alert(db, alert_of(job, cluster, now=now), at=now)
            if alert_id is not None:
                fired.append(alert_id)
    return fired


class MaxWaitCheck:
    """The check as a step of the control loop: runs :func:`fire_max_wait_alerts` at
    most every ``every_s`` (by ``clock``) on the cluster ``cluster()`` returns, and calls
    ``on_fired`` when alerts fired (the server wakes its webhook deliveries)."""

    def __init__(
        self,
        sessions: sessionmaker[DbSession],
        cluster: Callable[[], Cluster],
        *,
        clock: Callable[[], float],
        every_s: float = DEFAULT_CHECK_EVERY_S,
        on_fired: Callable[[], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.cluster = cluster
        self.clock = clock
        self.every_s = every_s
        self.on_fired = on_fired
        self._next = float("-inf")
        self.fired = 0
        """Alerts this check fired since it was made."""

    def __call__(self) -> list[int]:
        now = self.clock()
        if now < self._next:
            return []
        self._next = now + self.every_s
        fired = fire_max_wait_alerts(self.sessions, self.cluster(), now=now)
        if fired:
            self.fired += len(fired)
            log.info("fired %d max_wait alert(s)", len(fired))
            if self.on_fired is not None:
                self.on_fired()
        return fired
