"""The alert repository: firing an alert once, claiming its webhook delivery, listing.

Functions take a ``Session`` and never commit; the caller's transaction decides what
lands together (the events :func:`fire_alert` adds are flushed with it).
:func:`fire_alert` inserts with ``ON CONFLICT (dedupe_key) DO NOTHING`` (SQLite and
PostgreSQL alike), so two checks — on two servers, or before and after a restart — fire
an alert once. Deliveries are claimed with a lease (:func:`claim_delivery`): the claim
moves ``next_try_at`` to the lease's end only if nobody moved it first, and the result
is applied only while that lease still holds (:func:`finish_delivery`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from allotment.domain.errors import NotFound
from allotment.store.jobs import get_job
from allotment.store.models import Alert, Event

ALERT = "alert"
"""Event kind of an alert on a job."""

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
NONE = "none"
DELIVERY_STATES = (PENDING, DELIVERED, FAILED, NONE)
"""``pending``: a try is due at ``next_try_at``; ``delivered``: a 2xx answer;
``failed``: tries exhausted; ``none``: no webhook configured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NewAlert:
    """An alert to fire: what, about which job, for whom, and where to deliver it."""

    kind: str
    dedupe_key: str
    message: str
    tenant: str | None
    queue: str | None = None
    job_id: str | None = None
    detail: dict[str, Any]
    webhook: str | None = None


def fire_alert(session: Session, alert: NewAlert, *, at: float) -> int | None:
    """Insert ``alert`` unless one with its ``dedupe_key`` exists; return the new row's
    id, or ``None`` when it had fired already (nothing is written then). With a job, an
    ``alert`` event is appended to the job's events in the same transaction. Delivery is
    ``pending`` (due at once) with a webhook, else ``none``."""
    values: dict[str, Any] = {
        "kind": alert.kind,
        "job_id": alert.job_id,
        "tenant": alert.tenant,
        "queue": alert.queue,
        "dedupe_key": alert.dedupe_key,
        "at": at,
        "message": alert.message,
        "detail": alert.detail,
        "webhook": alert.webhook,
        "delivery": PENDING if alert.webhook else NONE,
        "tries": 0,
        "next_try_at": at if alert.webhook else None,
    }
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        statement: Any = postgresql.insert(Alert).values(**values)
    elif dialect == "sqlite":
        statement = sqlite.insert(Alert).values(**values)
    else:  # pragma: no cover - the store runs on SQLite and PostgreSQL only
        statement = insert(Alert).values(**values)
    if dialect in ("postgresql", "sqlite"):
        statement = statement.on_conflict_do_nothing(index_elements=["dedupe_key"])
    alert_id = session.execute(statement.returning(Alert.id)).scalar_one_or_none()
    if alert_id is None:
        return None
    if alert.job_id is not None:
        session.add(
            Event(
                job_id=alert.job_id,
                at=at,
                kind=ALERT,
                from_state=None,
                to_state=None,
                message=alert.message,
                detail={"alert": alert.kind, "alert_id": alert_id, **alert.detail},
            )
        )
    return int(alert_id)


def due_deliveries(session: Session, *, now: float, limit: int = 50) -> Sequence[Alert]:
    """Alerts whose webhook call is due (``pending`` with ``next_try_at <= now``),
    oldest due first."""
    query = (
        select(Alert)
        .where(Alert.delivery == PENDING, Alert.next_try_at <= now)
        .order_by(Alert.next_try_at, Alert.id)
        .limit(limit)
    )
    return session.scalars(query).all()


def claim_delivery(session: Session, alert: Alert, *, now: float, lease_s: float) -> float | None:
    """Take the lease on ``alert``'s next try: count the try and move ``next_try_at`` to
    ``now + lease_s``, only if no one changed it since ``alert`` was read. Returns the
    lease (its ``next_try_at``), or ``None`` when another worker took it. Commit before
    calling the webhook, so that the lease is seen."""
    lease = now + lease_s
    result = session.execute(
        update(Alert)
        .where(
            Alert.id == alert.id,
            Alert.delivery == PENDING,
            Alert.next_try_at == alert.next_try_at,
        )
        .values(next_try_at=lease, tries=Alert.tries + 1)
        .execution_options(synchronize_session=False)
    )
    return lease if _rowcount(result) == 1 else None


def finish_delivery(
    session: Session,
    alert_id: int,
    *,
    lease: float,
    delivered_at: float | None,
    error: str | None,
    retry_at: float | None,
) -> bool:
    """Apply a try's result while the lease still holds: ``delivered`` when
    ``delivered_at`` is given; else ``last_error`` and another try at ``retry_at``, or
    ``failed`` when ``retry_at`` is ``None``. Returns whether the lease held."""
    values: dict[str, Any]
    if delivered_at is not None:
        values = {"delivery": DELIVERED, "delivered_at": delivered_at, "next_try_at": None}
    elif retry_at is not None:
        values = {"next_try_at": retry_at, "last_error": error}
    else:
        values = {"delivery": FAILED, "next_try_at": None, "last_error": error}
    result = session.execute(
        update(Alert)
        .where(Alert.id == alert_id, Alert.delivery == PENDING, Alert.next_try_at == lease)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return _rowcount(result) == 1


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def list_alerts(
    session: Session,
    *,
    tenant: str | None = None,
    kind: str | None = None,
    job_id: str | None = None,
    since: float | None = None,
    after: int | None = None,
    limit: int = 100,
) -> Sequence[Alert]:
    """Alerts by id, filtered in the query; only ``tenant``'s when given. A ``job_id``
    of another tenant raises :class:`NotFound`, as an unknown one does."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    query = select(Alert)
    if tenant is not None:
        query = query.where(Alert.tenant == tenant)
    if job_id is not None:
        job = get_job(session, job_id)
        if tenant is not None and job.tenant != tenant:
            raise NotFound("job", job_id)
        query = query.where(Alert.job_id == job_id)
    if kind is not None:
        query = query.where(Alert.kind == kind)
    if since is not None:
        query = query.where(Alert.at >= since)
    if after is not None:
        query = query.where(Alert.id > after)
    return session.scalars(query.order_by(Alert.id).limit(limit)).all()
