"""Scratch-data expiry per tenant: report first, delete after a grace.

A tenant with ``scratch_expiry`` has the working directory of each attempt of its
*ended* jobs (succeeded, failed, cancelled or reclaimed, the attempt closed) that ended
longer ago than that reported: a ``scratch_report`` event on the job and a
``scratch.report`` audit record with the path and size. A later pass, once
``scratch_grace`` has passed since that report, deletes the directory (a
``scratch_deleted`` event and a ``scratch.delete`` audit record). Only directories
below the work root, as :mod:`allotment.store.layout` names them, are touched; a
symbolic link is never followed.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import and_, literal, select, tuple_
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import JobState
from allotment.domain.tenancy import Tenant
from allotment.store import audit
from allotment.store.layout import attempt_dir
from allotment.store.models import Attempt, Event, Job

log = logging.getLogger(__name__)

SCRATCH_REPORT = "scratch_report"
SCRATCH_DELETED = "scratch_deleted"
ENDED = (
    JobState.SUCCEEDED.value,
    JobState.FAILED.value,
    JobState.CANCELLED.value,
    JobState.RECLAIMED.value,
)
BATCH = 500
"""At most this many expired attempts are looked at per tenant and pass."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScratchAction:
    """One report or deletion of one attempt's directory."""

    action: str
    job_id: str
    attempt: int
    path: Path
    size: int


def _size(path: Path) -> int:
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file() and not item.is_symlink():
                total += item.stat().st_size
        except OSError:
            continue
    return total


def _inside(root: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except (OSError, ValueError):
        return False
    return True


Cursor = tuple[float, str, int]
"""``(end time, job, attempt)``: every expired attempt up to it has no directory left."""


def expire_scratch(
    store_sessions: sessionmaker[DbSession],
    cluster: Cluster,
    work_root: Path,
    now: float,
    cursors: dict[str, Cursor] | None = None,
) -> list[ScratchAction]:
    """One pass: report what has expired, delete what was reported at least the grace
    ago. Reads in one session, deletes outside any transaction, then writes the events
    and audit records in one short transaction. Blocks for the deletions. ``cursors``
    (per tenant, kept by the caller between passes) skip the attempts already cleaned,
    so that a long history never hides newer expired directories."""
    root = Path(work_root)
    cursors = {} if cursors is None else cursors
    planned: list[tuple[str, ScratchAction, dict[str, Any]]] = []
    with store_sessions() as db:
        for tenant in cluster.tenants.values():
            if tenant.scratch_expiry is not None:
                planned += _plan(db, tenant, root, now, cursors)
    done: list[tuple[str, ScratchAction, dict[str, Any]]] = []
    for tenant_name, action, detail in planned:
        if action.action == "delete":
            try:
                shutil.rmtree(action.path)
            except OSError as exc:
                log.warning("cannot delete expired scratch %s: %s", action.path, exc)
                continue
        done.append((tenant_name, action, detail))
    if done:
        with store_sessions.begin() as db:
            for tenant_name, action, detail in done:
                if action.action == "report":
                    kind, name = SCRATCH_REPORT, "scratch.report"
                    message = (
                        f"scratch of attempt {action.attempt} expired; deleted after the grace"
                    )
                else:
                    kind, name = SCRATCH_DELETED, "scratch.delete"
                    message = f"scratch of attempt {action.attempt} deleted ({action.size} bytes)"
                _record(db, now, tenant_name, action.job_id, kind, name, detail, message)
    return [action for _, action, _ in done]


def _plan(
    db: DbSession, tenant: Tenant, root: Path, now: float, cursors: dict[str, Cursor]
) -> list[tuple[str, ScratchAction, dict[str, Any]]]:
    """What to report and what to delete of one tenant's expired directories (the next
    :data:`BATCH` expired attempts after the tenant's cursor)."""
    assert tenant.scratch_expiry is not None
    conditions = [
        Job.tenant == tenant.name,
        Job.state.in_(ENDED),
        Attempt.end_time.is_not(None),
        Attempt.end_time < now - tenant.scratch_expiry,
    ]
    cursor = cursors.get(tenant.name)
    if cursor is not None:
        after = tuple_(*(literal(value) for value in cursor))
        conditions.append(tuple_(Attempt.end_time, Job.id, Attempt.number) > after)
    rows = db.execute(
        select(Job.id, Attempt.number, Attempt.end_time)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(and_(*conditions))
        .order_by(Attempt.end_time, Job.id, Attempt.number)
        .limit(BATCH)
    ).all()
    candidates = []
    cleaned_so_far = True
    for job_id, number, ended in rows:
        path = attempt_dir(root, tenant.name, job_id, number)
        if path.is_dir() and not path.is_symlink() and _inside(root, path):
            candidates.append((job_id, number, ended, path))
            cleaned_so_far = False
        elif cleaned_so_far:
            cursors[tenant.name] = (ended, job_id, number)
    if not candidates:
        return []
    reports: dict[tuple[str, int], float] = {}
    ids = list({c[0] for c in candidates})
    for event in db.scalars(
        select(Event).where(Event.kind == SCRATCH_REPORT, Event.job_id.in_(ids))
    ):
        number = event.detail.get("attempt")
        if event.job_id is not None and isinstance(number, int):
            key = (event.job_id, number)
            reports[key] = max(reports.get(key, event.at), event.at)
    out: list[tuple[str, ScratchAction, dict[str, Any]]] = []
    for job_id, number, ended, path in candidates:
        reported = reports.get((job_id, number))
        detail: dict[str, Any] = {"attempt": number, "path": str(path.relative_to(root))}
        if reported is None:
            action = "report"
            detail.update(
                ended_at=ended,
                expiry_s=tenant.scratch_expiry,
                delete_after=now + tenant.scratch_grace,
            )
        elif now - reported >= tenant.scratch_grace:
            action = "delete"
            detail["reported_at"] = reported
        else:
            continue
        size = _size(path)
        detail["bytes"] = size
        out.append(
            (
                tenant.name,
                ScratchAction(action=action, job_id=job_id, attempt=number, path=path, size=size),
                detail,
            )
        )
    return out


def _record(
    db: DbSession,
    now: float,
    tenant: str,
    job_id: str,
    kind: str,
    action: str,
    detail: dict[str, Any],
    message: str,
) -> None:
    db.add(Event(job_id=job_id, at=now, kind=kind, message=message, detail=detail))
    audit.append_system(db, at=now, tenant=tenant, action=action, object=job_id, detail=detail)
