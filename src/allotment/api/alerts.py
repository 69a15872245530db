"""Alerts as the API shows them (``GET /api/v1/alerts``): one page, narrowed to the
asker's tenant in the query. The webhook's URL is not shown (it may hold a secret)."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from allotment.api import schemas
from allotment.store.alerts import list_alerts
from allotment.store.models import Alert


def alert_out(alert: Alert) -> schemas.AlertOut:
    return schemas.AlertOut(
        id=alert.id,
        kind=alert.kind,
        job=alert.job_id,
        tenant=alert.tenant,
        queue=alert.queue,
        at=alert.at,
        message=alert.message,
        detail=dict(alert.detail or {}),
        delivery=alert.delivery,
        tries=alert.tries,
        next_try_at=alert.next_try_at,
        delivered_at=alert.delivered_at,
        last_error=alert.last_error,
    )


def alerts_page(
    sessions: sessionmaker[Session],
    *,
    tenant: str | None,
    kind: str | None,
    job: str | None,
    since: float | None,
    after: int | None,
    limit: int,
) -> schemas.AlertPage:
    """A page of alerts by id; only ``tenant``'s when given (``None``: every tenant's).
    Raises ``NotFound`` for a ``job`` that is unknown or of another tenant."""
    with sessions() as db:
        rows = list_alerts(
            db, tenant=tenant, kind=kind, job_id=job, since=since, after=after, limit=limit + 1
        )
        page = [alert_out(row) for row in rows[:limit]]
    more = len(rows) > limit
    return schemas.AlertPage(alerts=page, next_after=page[-1].id if more and page else None)
