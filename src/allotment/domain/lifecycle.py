"""Job lifecycle states, failure classes and the one transition function.

``submitted → pending → admitted → starting → running → {succeeded | failed | preempted |
cancelled | reclaimed}``; ``failed`` and ``preempted`` may go back to ``pending`` under the
retry policy. :func:`transition` is the only place that decides whether a move is legal;
the store's single state mutator calls it and writes the event it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from allotment.domain.errors import IllegalTransition


class JobState(StrEnum):
    SUBMITTED = "submitted"
    PENDING = "pending"
    ADMITTED = "admitted"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"


class FailureClass(StrEnum):
    """Why an attempt ended without success."""

    USER_CODE = "user_code"
    OOM = "oom"
    IMAGE = "image"
    LAUNCH = "launch"
    """The command could not be started (no such program, not executable)."""
    RESOURCES = "resources"
    NODE_FAILURE = "node_failure"
    DATA_ACCESS = "data_access"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"


_S = JobState
_ENDINGS = frozenset({_S.SUCCEEDED, _S.FAILED, _S.PREEMPTED, _S.CANCELLED, _S.RECLAIMED})
_FAILURES = _ENDINGS - {_S.SUCCEEDED}
"""Endings that carry a failure class."""

ALLOWED: dict[JobState, frozenset[JobState]] = {
    _S.SUBMITTED: frozenset({_S.PENDING, _S.FAILED, _S.CANCELLED}),
    _S.PENDING: frozenset({_S.ADMITTED, _S.FAILED, _S.CANCELLED}),
    _S.ADMITTED: frozenset({_S.STARTING, _S.PENDING, _S.FAILED, _S.PREEMPTED, _S.CANCELLED}),
    _S.STARTING: frozenset({_S.RUNNING} | _ENDINGS),
    _S.RUNNING: _ENDINGS,
    _S.FAILED: frozenset({_S.PENDING}),
    _S.PREEMPTED: frozenset({_S.PENDING, _S.CANCELLED}),
    _S.SUCCEEDED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.RECLAIMED: frozenset(),
}
"""Every legal move. ``admitted → pending`` is an admission withdrawn before start;
``preempted → cancelled`` is a cancel of a preempted job waiting to be requeued."""

TERMINAL = frozenset(s for s, targets in ALLOWED.items() if not targets)
"""States no job leaves."""

ACTIVE = frozenset({_S.ADMITTED, _S.STARTING, _S.RUNNING})
"""States that hold an allocation."""

WAITING = frozenset({_S.SUBMITTED, _S.PENDING})

IMPLIED_FAILURE: dict[JobState, FailureClass] = {
    _S.PREEMPTED: FailureClass.PREEMPTED,
    _S.CANCELLED: FailureClass.CANCELLED,
    _S.RECLAIMED: FailureClass.RECLAIMED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One accepted move, ready to be written as an event."""

    source: JobState
    target: JobState
    at: float
    reason: str
    failure: FailureClass | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def transition(
    current: JobState,
    target: JobState,
    *,
    at: float,
    reason: str,
    failure: FailureClass | None = None,
    detail: dict[str, Any] | None = None,
) -> Transition:
    """Validate ``current → target`` and return the event describing it.

    ``at`` is the caller's clock (seconds since the epoch); ``reason`` is a short code or
    sentence. A move to ``failed`` must name its failure class; preempted, cancelled and
    reclaimed imply theirs. Raises :class:`IllegalTransition` for any move not in
    :data:`ALLOWED` and :class:`ValueError` for a missing or contradictory failure class.
    """
    current = JobState(current)
    target = JobState(target)
    if target not in ALLOWED[current]:
        raise IllegalTransition(
            current.value, target.value, sorted(s.value for s in ALLOWED[current])
        )
    implied = IMPLIED_FAILURE.get(target)
    if target is JobState.FAILED and failure is None:
        raise ValueError("a move to failed must name its failure class")
    if implied is not None:
        if failure is not None and failure is not implied:
            raise ValueError(f"a move to {target.value} implies failure class {implied.value}")
        failure = implied
    if target not in _FAILURES and failure is not None:
        raise ValueError(f"a move to {target.value} carries no failure class")
    return Transition(
        source=current,
        target=target,
        at=at,
        reason=reason,
        failure=failure,
        detail=dict(detail or {}),
    )
