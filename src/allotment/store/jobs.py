"""The job repository, with the one function that changes a job's state.

Every function takes a ``Session`` and flushes but never commits: the caller's
transaction decides what lands together. :func:`transition_job` (and its set-based form
:func:`transition_jobs`) is the only writer of ``Job.state`` and :func:`record_reason`
(:func:`record_reasons`) the only writer of the waiting-reason condition; each appends
its :class:`~allotment.store.models.Event` in the same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    Table,
    and_,
    bindparam,
    insert,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.util import identity_key

from allotment.domain.errors import AlreadyEnded, NotFound
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import (
    ALLOWED,
    WAITING,
    FailureClass,
    JobState,
    Transition,
    transition,
)
from allotment.domain.reasons import Reason
from allotment.store.models import Attempt, Base, Event, Job

TRANSITION = "transition"
"""Event kind of a state change."""

REASON = "reason"
"""Event kind of a change of the waiting reason."""


def new_job_id() -> str:
    """A fresh job id: ``j-`` and 16 hex digits of a random UUID."""
    return f"j-{uuid.uuid4().hex[:16]}"


def create_job(
    session: Session,
    spec: JobSpec,
    *,
    tenant: str,
    user: str,
    at: float,
    priority_class: str | None = None,
    job_id: str | None = None,
    not_before: float | None = None,
    accepted: str | None = None,
) -> Job:
    """Insert a job in state ``submitted`` and its ``submitted`` event; return the row.
    With ``accepted`` (the message of the move), the job is inserted already
    ``pending``, with the ``submitted → pending`` event after the first: one row and
    two events, the same history as :func:`transition_job` would leave, in one write.

    ``priority_class`` is the resolved class (the cluster default when the spec names
    none); the spec's own is used when it is omitted. Raises ``ValueError`` when neither
    names one. ``at`` is the submit time, in seconds since the epoch.
    """
    resolved = priority_class or spec.priority_class
    if not resolved:
        raise ValueError("a job needs a priority class: the spec names none and none was given")
    move = None
    if accepted is not None:
        move = transition(JobState.SUBMITTED, JobState.PENDING, at=at, reason=accepted)
    row: dict[str, Any] = {
        "id": job_id or new_job_id(),
        "name": spec.name,
        "tenant": tenant,
        "queue": spec.queue,
        "user": user,
        "type": spec.type.value,
        "priority_class": resolved,
        "spec": spec.model_dump(mode="json"),
        "state": (move.target if move is not None else JobState.SUBMITTED).value,
        "failure_class": None,
        "attempt": 0,
        "submit_time": at,
        "not_before": not_before,
        "created_at": at,
        "updated_at": at,
    }
    # Core inserts (the unit of work's flushes cost more than the rows), then the row
    # as an object of the session, as a flush would have left it.
    session.execute(_INSERT_JOB, row)
    events = [
        {
            "job_id": row["id"],
            "at": at,
            "kind": TRANSITION,
            "from_state": None,
            "to_state": JobState.SUBMITTED.value,
            "message": "submitted",
            "detail": {},
        }
    ]
    if move is not None:
        events.append(_event_row(row["id"], move))
    session.execute(_INSERT_EVENTS, events)
    job = Job(**row, reason_code=None, reason_message=None, reason_detail=None, reason_since=None)
    make_transient_to_detached(job)
    session.add(job)
    return job


def get_job(session: Session, job_id: str, *, for_update: bool = False) -> Job:
    """The job ``job_id``; raises :class:`NotFound` when there is none.

    ``for_update`` locks the row until the transaction ends (PostgreSQL; SQLite
    serialises writers anyway).
    """
    query = select(Job).where(Job.id == job_id)
    if for_update:
        query = query.with_for_update()
    job = session.scalars(query).one_or_none()
    if job is None:
        raise NotFound("job", job_id)
    return job


def transition_job(
    session: Session,
    job_id: str,
    to_state: JobState,
    *,
    at: float,
    message: str,
    detail: dict[str, Any] | None = None,
    failure_class: FailureClass | None = None,
    job: Job | None = None,
    flush: bool = True,
) -> Job:
    """Move job ``job_id`` to ``to_state`` and append the transition event.

    ``job`` is the row when the caller already has it in ``session`` and no other
    transaction can change it (the caller inserted it, or locked it): the query, and
    with it the row lock, is skipped. Without ``flush`` the writes wait for the
    session's next flush, so that a caller moving many jobs writes them together.

    The move is validated by the domain's :func:`~allotment.domain.lifecycle.transition`
    before anything is written: an illegal move raises
    :class:`~allotment.domain.errors.IllegalTransition` (a missing or contradictory
    failure class ``ValueError``) and leaves the row and the events as they were.
    Raises :class:`NotFound` for an unknown job. Locks the job row (PostgreSQL).
    """
    if job is None or job.id != job_id:
        job = get_job(session, job_id, for_update=True)
    move = transition(
        JobState(job.state),
        to_state,
        at=at,
        reason=message,
        failure=failure_class,
        detail=detail,
    )
    for column, value in _moved(move, at).items():
        setattr(job, column, value)
    session.add(_event(job.id, move))
    if flush:
        session.flush()
    return job


def _moved(move: Transition, at: float) -> dict[str, Any]:
    """The job row's columns after ``move``, for one job or a batch."""
    columns: dict[str, Any] = {
        "state": move.target.value,
        "failure_class": move.failure.value if move.failure is not None else None,
        "updated_at": at,
    }
    if move.target not in WAITING:
        # A reason says why a job waits: one that no longer waits has none.
        columns.update(reason_code=None, reason_message=None, reason_detail=None, reason_since=None)
    return columns


def _event(job_id: str, move: Transition) -> Event:
    """The event that records ``move`` of job ``job_id``."""
    return Event(**_event_row(job_id, move))


def _event_row(job_id: str, move: Transition) -> dict[str, Any]:
    """The columns of the event that records ``move`` of job ``job_id``."""
    detail = dict(move.detail)
    if move.failure is not None:
        detail["failure_class"] = move.failure.value
    return {
        "job_id": job_id,
        "at": move.at,
        "kind": TRANSITION,
        "from_state": move.source.value,
        "to_state": move.target.value,
        "message": move.reason,
        "detail": detail,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChange:
    """One move for :func:`transition_jobs`: job ``job_id``, found in state ``source``
    under its row lock, to ``target``."""

    job_id: str
    source: JobState
    target: JobState
    message: str
    detail: dict[str, Any] | None = None
    failure: FailureClass | None = None
    attempt: int | None = None
    """The job's current attempt, which takes the job's new state (and failure class),
    as :func:`sync_attempt` does; ``None``: no attempt row is touched."""
    values: dict[str, Any] | None = None
    """Other columns of the job row written with the move (``{"attempt": 2}``)."""


def transition_jobs(session: Session, changes: Sequence[StateChange], *, at: float) -> None:
    """:func:`transition_job` (with :func:`sync_attempt` where a change names its
    attempt) for many jobs at once, the rows written as :func:`transition_job` writes
    them and the events in the order of ``changes``: one ``UPDATE`` of the jobs, one
    ``INSERT`` of the events and one ``UPDATE`` of the attempts, each sent as one batch
    (per set of columns), without the ORM's work per row.

    The caller has locked the rows and read their states (``source``): every move is
    validated by the domain's :func:`~allotment.domain.lifecycle.transition` before
    anything is written, so an illegal one raises and writes nothing. Objects of these
    jobs and attempts already in ``session`` are expired, so that they are read again.
    """
    moves = [
        transition(
            change.source,
            change.target,
            at=at,
            reason=change.message,
            failure=change.failure,
            detail=change.detail,
        )
        for change in changes
    ]
    if not moves:
        return
    session.flush()  # what the caller added before lands first
    jobs: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    for change, move in zip(changes, moves, strict=True):
        row = {"id": change.job_id, **_moved(move, at), **(change.values or {})}
        jobs.append(row)
        if change.attempt is not None:
            attempt = {"job_id": change.job_id, "number": change.attempt, "state": row["state"]}
            if row["failure_class"] is not None:  # as sync_attempt: a class, once set, stays
                attempt["failure_class"] = row["failure_class"]
            attempts.append(attempt)
    _update_rows(session, _JOBS, ("id",), jobs)
    session.execute(
        insert(_EVENTS), [_event_row(c.job_id, m) for c, m in zip(changes, moves, strict=True)]
    )
    _update_rows(session, _ATTEMPTS, ("job_id", "number"), attempts)
    _expire(session, Job, [(c.job_id,) for c in changes])
    _expire(session, Attempt, [(a["job_id"], a["number"]) for a in attempts])


_JOBS = Base.metadata.tables["jobs"]
_EVENTS = Base.metadata.tables["events"]
_ATTEMPTS = Base.metadata.tables["attempts"]
_INSERT_JOB = insert(_JOBS)
_INSERT_EVENTS = insert(_EVENTS)


def _update_rows(
    session: Session, table: Table, keys: tuple[str, ...], rows: Sequence[Mapping[str, Any]]
) -> None:
    """``UPDATE table`` of every row of ``rows`` (its ``keys`` columns name it, the others
    are its new values): one batch of statements per set of columns."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row), []).append(row)
    for columns, group in groups.items():
        statement = (
            update(table)
            .where(*(table.c[k] == bindparam(f"k_{k}") for k in keys))
            .values({c: bindparam(f"v_{c}") for c in columns if c not in keys})
        )
        params = [{(f"k_{c}" if c in keys else f"v_{c}"): v for c, v in r.items()} for r in group]
        session.execute(statement, params)


def _expire(session: Session, model: type[Base], keys: Iterable[tuple[Any, ...]]) -> None:
    """Expire the objects of ``model`` with primary ``keys`` that ``session`` holds."""
    held = session.identity_map
    if not len(held):
        return
    for key in keys:
        obj = held.get(identity_key(model, key))
        if obj is not None:
            session.expire(obj)


def update_attempts(session: Session, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write columns of attempts set-based: each row names its attempt (``job_id``,
    ``number``) and holds its new values (``{"end_time": ...}``); one batch per set of
    columns. Objects of these attempts already in ``session`` are expired."""
    if not rows:
        return
    session.flush()  # what the caller added before lands first
    _update_rows(session, _ATTEMPTS, ("job_id", "number"), rows)
    _expire(session, Attempt, [(row["job_id"], row["number"]) for row in rows])


def sync_attempt(session: Session, job: Job) -> None:
    """The job's current attempt takes the job's state (and failure class, when set)."""
    attempt = session.get(Attempt, (job.id, job.attempt))
    if attempt is not None:
        attempt.state = job.state
        if job.failure_class is not None:
            attempt.failure_class = job.failure_class


def cancel_job(session: Session, job_id: str, *, at: float, by: str | None = None) -> Job:
    """Cancel job ``job_id`` (the row locked); return it, now ``cancelled``.

    A waiting job leaves its line at once; one holding an allocation (or preempted and
    waiting to be requeued) is ``cancelled`` in the store, its open attempt with it, and
    the control loop then stops its replicas and frees its resources. Raises
    :class:`AlreadyEnded` for a job that has ended (succeeded, failed, cancelled,
    reclaimed) and :class:`NotFound` for an unknown one; neither writes anything.
    """
    job = get_job(session, job_id, for_update=True)
    state = JobState(job.state)
    if JobState.CANCELLED not in ALLOWED[state]:
        raise AlreadyEnded(job_id, state.value, "cancel")
    job = transition_job(
        session,
        job_id,
        JobState.CANCELLED,
        at=at,
        message="cancelled" if by is None else f"cancelled by {by}",
        detail={"by": by, "from": state.value, "attempt": job.attempt},
    )
    attempt = session.get(Attempt, (job.id, job.attempt))
    if attempt is not None and attempt.end_time is None:
        attempt.state = job.state
        attempt.failure_class = job.failure_class
    session.flush()
    return job


def requeue_job(
    session: Session,
    job_id: str,
    *,
    at: float,
    not_before: float | None,
    message: str,
    detail: dict[str, Any] | None = None,
) -> Job:
    """Move a failed or preempted job back to ``pending``, not to start before
    ``not_before`` (seconds since the epoch; ``None``: at once). Raises like
    :func:`transition_job`."""
    job = transition_job(session, job_id, JobState.PENDING, at=at, message=message, detail=detail)
    job.not_before = not_before
    session.flush()
    return job


def record_reason(session: Session, job_id: str, reason: Reason, *, at: float) -> bool:
    """Keep ``reason`` as the job's waiting condition; return whether it changed.

    Writes (the row and a ``reason`` event) only when the code or the message differs
    from the stored one, so a scheduler cycle that finds the same reason writes nothing.
    Raises :class:`NotFound` for an unknown job.
    """
    changed = _set_reason(session, get_job(session, job_id), reason, at)
    session.flush()
    return changed


def _set_reason(session: Session, job: Job, reason: Reason, at: float) -> bool:
    """Set ``job``'s reason and add its event, unless it is the stored one already."""
    code = reason.code.value
    if job.reason_code == code and job.reason_message == reason.message:
        return False
    job.reason_code = code
    job.reason_message = reason.message
    job.reason_detail = dict(reason.detail)
    job.reason_since = at
    job.updated_at = at
    session.add(
        Event(
            job_id=job.id,
            at=at,
            kind=REASON,
            from_state=None,
            to_state=None,
            message=reason.message,
            detail=reason.to_dict(),
        )
    )
    return True


IN_CHUNK = 500
"""Ids per ``IN (...)`` query: well under SQLite's and PostgreSQL's parameter limits."""


def record_reasons(
    session: Session,
    reasons: Mapping[str, Reason],
    *,
    at: float,
    states: Iterable[JobState] | None = None,
) -> list[str]:
    """:func:`record_reason` for many jobs at once: one narrow query per :data:`IN_CHUNK`
    ids, then the changed rows and their events written in one batch each (the same
    rows and events as :func:`record_reason`'s). Unknown ids, and jobs in none of
    ``states`` when given, are skipped. Returns the ids whose reason changed."""
    session.flush()  # what the caller added before lands first
    changed: list[str] = []
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    ids = list(reasons)
    only = None if states is None else [JobState(s).value for s in states]
    for start in range(0, len(ids), IN_CHUNK):
        chunk = ids[start : start + IN_CHUNK]
        query = select(Job.id, Job.reason_code, Job.reason_message).where(Job.id.in_(chunk))
        if only is not None:
            query = query.where(Job.state.in_(only))
        for job_id, code, message in session.execute(query).tuples():
            reason = reasons[job_id]
            if code == reason.code.value and message == reason.message:
                continue
            changed.append(job_id)
            rows.append(
                {
                    "id": job_id,
                    "reason_code": reason.code.value,
                    "reason_message": reason.message,
                    "reason_detail": dict(reason.detail),
                    "reason_since": at,
                    "updated_at": at,
                }
            )
            events.append(
                {
                    "job_id": job_id,
                    "at": at,
                    "kind": REASON,
                    "from_state": None,
                    "to_state": None,
                    "message": reason.message,
                    "detail": reason.to_dict(),
                }
            )
    if rows:
        _update_rows(session, _JOBS, ("id",), rows)
        session.execute(insert(_EVENTS), events)
        _expire(session, Job, [(job_id,) for job_id in changed])
    return changed


def job_states(
    session: Session, ids: Iterable[str], *, for_update: bool = False
) -> dict[str, tuple[JobState, int]]:
    """State and latest attempt number of the jobs among ``ids`` (unknown ones
    skipped), without reading whole rows; one query per :data:`IN_CHUNK` ids.
    ``for_update`` locks them, in id order, as :func:`jobs_by_id` does."""
    wanted = sorted(set(ids))
    found: dict[str, tuple[JobState, int]] = {}
    for start in range(0, len(wanted), IN_CHUNK):
        query = select(Job.id, Job.state, Job.attempt).where(
            Job.id.in_(wanted[start : start + IN_CHUNK])
        )
        if for_update:
            query = query.order_by(Job.id).with_for_update()
        for job_id, state, attempt in session.execute(query).tuples():
            found[job_id] = (JobState(state), attempt)
    return found


def jobs_by_id(session: Session, ids: Iterable[str], *, for_update: bool = False) -> list[Job]:
    """The jobs among ``ids`` (unknown ones skipped), in submission order; one query per
    :data:`IN_CHUNK` ids. ``for_update`` locks them, in id order (two writers never wait
    for each other in a circle)."""
    wanted = sorted(set(ids))
    rows: list[Job] = []
    for start in range(0, len(wanted), IN_CHUNK):
        query = select(Job).where(Job.id.in_(wanted[start : start + IN_CHUNK]))
        if for_update:
            query = query.order_by(Job.id).with_for_update()
        rows.extend(session.scalars(query))
    rows.sort(key=lambda job: (job.submit_time, job.id))
    return rows


def list_jobs(
    session: Session,
    *,
    queue: str | None = None,
    tenant: str | None = None,
    states: Iterable[JobState] | None = None,
    limit: int = 100,
    after: str | None = None,
) -> Sequence[Job]:
    """Jobs in submission order (``submit_time``, then id), filtered in the query.

    ``after`` is the id of the last job of the previous page (keyset pagination); an
    unknown ``after`` (or, with ``tenant``, one of another tenant) raises
    :class:`NotFound`. ``limit`` must be positive.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    query = select(Job)
    if queue is not None:
        query = query.where(Job.queue == queue)
    if tenant is not None:
        query = query.where(Job.tenant == tenant)
    if states is not None:
        query = query.where(Job.state.in_([JobState(s).value for s in states]))
    if after is not None:
        last = get_job(session, after)
        if tenant is not None and last.tenant != tenant:
            raise NotFound("job", after)  # another tenant's job is no cursor
        query = query.where(
            or_(
                Job.submit_time > last.submit_time,
                and_(Job.submit_time == last.submit_time, Job.id > last.id),
            )
        )
    query = query.order_by(Job.submit_time, Job.id).limit(limit)
    return session.scalars(query).all()


def jobs_in_groups(
    session: Session,
    groups: Sequence[Iterable[JobState]],
    *,
    limit: int = 100,
    tenant: str | None = None,
) -> list[list[Job]]:
    """For each group of states, its first ``limit`` jobs in submission order (only
    ``tenant``'s when given), all read in one statement: a job that changes from one
    group to another meanwhile is found in exactly one of them. (One query per group
    would miss a job admitted between the waiting jobs' query and the running jobs'.)"""
    if limit <= 0:
        raise ValueError("limit must be positive")
    parts = []
    for index, states in enumerate(groups):
        part = select(Job.id.label("id"), literal(index, Integer).label("grp")).where(
            Job.state.in_([JobState(s).value for s in states])
        )
        if tenant is not None:
            part = part.where(Job.tenant == tenant)
        first = part.order_by(Job.submit_time, Job.id).limit(limit).subquery()
        parts.append(select(first.c.id, first.c.grp))
    out: list[list[Job]] = [[] for _ in groups]
    if not parts:
        return out
    chosen = union_all(*parts).subquery()
    query = (
        select(Job, chosen.c.grp)
        .join(chosen, Job.id == chosen.c.id)
        .order_by(Job.submit_time, Job.id)
    )
    for job, group in session.execute(query).all():
        out[group].append(job)
    return out


def events_for(session: Session, job_id: str) -> Sequence[Event]:
    """The job's events, oldest first (empty for an unknown job)."""
    return session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)).all()


def recent_jobs(
    session: Session, *, states: Iterable[JobState], limit: int = 20, tenant: str | None = None
) -> Sequence[Job]:
    """The jobs in ``states`` that changed last, newest first (only ``tenant``'s when
    given)."""
    query = select(Job).where(Job.state.in_([JobState(s).value for s in states]))
    if tenant is not None:
        query = query.where(Job.tenant == tenant)
    query = query.order_by(Job.updated_at.desc(), Job.id.desc()).limit(limit)
    return session.scalars(query).all()
