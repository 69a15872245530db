"""What accounting reads from the store, as the plain values of
:mod:`~allotment.accounting.figures` and :mod:`~allotment.accounting.waits`.

Every query is narrowed to one tenant's jobs in SQL when ``tenant`` is given (``None``:
every tenant), and to the window: attempts that held their allocation at some time in
it, samples that overlap it, events up to its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from allotment.accounting.figures import INTERRUPTIONS, AttemptInput, UsageSample, Window
from allotment.accounting.waits import ADMITTED, PENDING, Move
from allotment.domain.lifecycle import JobState
from allotment.domain.resources import CPU, GPU, MEMORY
from allotment.store.jobs import IN_CHUNK, TRANSITION
from allotment.store.models import Attempt, Event, Job, JobUsage

WAITING = (JobState.SUBMITTED.value, JobState.PENDING.value)


def _narrow(query: Select[Any], tenant: str | None) -> Select[Any]:
    return query if tenant is None else query.where(Job.tenant == tenant)


def _amount(allocation: Sequence[Any], resource: str) -> int:
    """An allocation's total of ``resource`` over its replicas, in milli-units."""
    total = 0
    for placement in allocation:
        resources = placement.get("resources", {}) if isinstance(placement, dict) else {}
        total += int(resources.get(resource, 0))
    return total


def attempts(session: Session, window: Window, tenant: str | None) -> list[AttemptInput]:
    """Attempts that started before the window's end and had not ended before its
    start, with their utilisation samples that overlap the window."""
    query = _narrow(
        select(Job, Attempt)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(
            Attempt.start_time.is_not(None),
            Attempt.start_time < window.until,
            or_(Attempt.end_time.is_(None), Attempt.end_time >= window.since),
        ),
        tenant,
    ).order_by(Job.id, Attempt.number)
    rows = session.execute(query).all()
    samples = _samples(session, window, tenant)
    found: list[AttemptInput] = []
    for job, attempt in rows:
        assert attempt.start_time is not None
        allocation = list(attempt.allocation or [])
        found.append(
            AttemptInput(
                job=job.id,
                attempt=attempt.number,
                tenant=job.tenant,
                queue=job.queue,
                user=job.user,
                type=job.type,
                priority_class=job.priority_class,
                state=attempt.state,
                failure_class=attempt.failure_class,
                pool=attempt.pool or "",
                start=attempt.start_time,
                end=attempt.end_time,
                gpu_milli=_amount(allocation, GPU),
                cpu_milli=_amount(allocation, CPU),
                memory_milli=_amount(allocation, MEMORY),
                samples=tuple(samples.get((job.id, attempt.number), ())),
            )
        )
    return found


def _samples(
    session: Session, window: Window, tenant: str | None
) -> dict[tuple[str, int], list[UsageSample]]:
    query = _narrow(
        select(
            JobUsage.job_id,
            JobUsage.attempt,
            JobUsage.interval_start,
            JobUsage.interval_s,
            JobUsage.gpu_util_avg,
        )
        .join(Job, Job.id == JobUsage.job_id)
        .where(
            JobUsage.interval_start < window.until,
            JobUsage.interval_start + JobUsage.interval_s > window.since,
        ),
        tenant,
    )
    found: dict[tuple[str, int], list[UsageSample]] = {}
    for job_id, number, start, length, util in session.execute(query):
        found.setdefault((job_id, number), []).append(
            UsageSample(start=start, length=length, util=util)
        )
    return found


@dataclass(frozen=True, slots=True)
class Histories:
    """The transitions that bear on waits, and each job's queue and priority class."""

    moves: list[Move]
    labels: dict[str, tuple[str, str]]


def histories(session: Session, window: Window, tenant: str | None) -> Histories:
    """Transitions up to the window's end of the jobs admitted in it and of those still
    waiting (submitted before its end and waiting now, or moved to pending in it)."""
    moved = _narrow(
        select(Job.id)
        .join(Event, Event.job_id == Job.id)
        .where(
            Event.kind == TRANSITION,
            Event.to_state.in_((ADMITTED, PENDING)),
            Event.at >= window.since,
            Event.at < window.until,
        ),
        tenant,
    )
    waiting = _narrow(
        select(Job.id).where(Job.state.in_(WAITING), Job.submit_time < window.until), tenant
    )
    ids = sorted(set(session.scalars(moved)) | set(session.scalars(waiting)))
    moves: list[Move] = []
    labels: dict[str, tuple[str, str]] = {}
    for start in range(0, len(ids), IN_CHUNK):
        chunk = ids[start : start + IN_CHUNK]
        for job_id, queue, priority_class in session.execute(
            select(Job.id, Job.queue, Job.priority_class).where(Job.id.in_(chunk))
        ):
            labels[job_id] = (queue, priority_class)
        query = (
            select(Event.job_id, Event.at, Event.to_state)
            .where(
                Event.job_id.in_(chunk),
                Event.kind == TRANSITION,
                Event.at < window.until,
            )
            .order_by(Event.job_id, Event.id)
        )
        for job_id, at, to_state in session.execute(query):
            moves.append(Move(job=job_id, at=at, to_state=to_state or ""))
    return Histories(moves=moves, labels=labels)


@dataclass(frozen=True, slots=True, kw_only=True)
class Interruption:
    """A preemption or a reclamation: its kind (``preempted``, ``reclaimed``), reason,
    and the job's queue."""

    kind: str
    reason: str
    queue: str


def interruption_reason(kind: str, message: str, detail: dict[str, Any]) -> str:
    """A preemption's ``cause``; a reclamation's ``reason`` (e.g. ``idle``); else the
    event's message."""
    for key in ("cause", "reason") if kind == JobState.PREEMPTED.value else ("reason", "cause"):
        value = detail.get(key)
        if isinstance(value, str) and value:
            return value
    return message or "unknown"


def interruptions(session: Session, window: Window, tenant: str | None) -> list[Interruption]:
    """Every move to ``preempted`` or ``reclaimed`` within the window."""
    query = _narrow(
        select(Event.to_state, Event.message, Event.detail, Job.queue)
        .join(Job, Job.id == Event.job_id)
        .where(
            and_(
                Event.kind == TRANSITION,
                Event.to_state.in_(INTERRUPTIONS),
                Event.at >= window.since,
                Event.at < window.until,
            )
        ),
        tenant,
    )
    return [
        Interruption(
            kind=kind,
            reason=interruption_reason(kind, message or "", dict(detail or {})),
            queue=queue,
        )
        for kind, message, detail, queue in session.execute(query)
    ]
