"""Why a job waits: the one closed set of reason codes.

Every pending job carries exactly one reason. When several apply to the same job (for
example it was tried in two pools), the most *actionable* wins by :data:`SEVERITY`: a
problem with the job itself (``invalid``, ``pool_not_allowed``, ``exceeds_queue_limit``)
beats a policy gate (``outside_time_window``, ``backoff``), which beats a shortage
(``quota_exhausted``, ``gang_unsatisfiable``, ``no_node_fits``), which beats being behind
other work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ReasonCode(StrEnum):
    """The closed set of reasons a job is not running (listed in the README's "How the
    scheduler decides")."""

    QUOTA_EXHAUSTED = "quota_exhausted"
    """The queue (or an ancestor) has no quota left in any acceptable pool, borrowing included."""
    EXCEEDS_QUEUE_LIMIT = "exceeds_queue_limit"
    """The job is larger than the queue's ``max_job`` or than its quota could ever allow."""
    NO_NODE_FITS = "no_node_fits"
    """Quota allows it but no node has the free resources for a replica."""
    GANG_UNSATISFIABLE = "gang_unsatisfiable"
    """Some replicas fit but not all of them at once."""
    POOL_NOT_ALLOWED = "pool_not_allowed"
    """None of the job's pools is open to its queue (or exists)."""
    OUTSIDE_TIME_WINDOW = "outside_time_window"
    """The queue admits nothing at this hour."""
    BEHIND_HIGHER_PRIORITY = "behind_higher_priority"
    """Jobs ahead of it in order (higher priority, fairer share or earlier) go first."""
    WAITING_FOR_PREEMPTION = "waiting_for_preemption"
    """Victims were preempted for it; their resources are reserved for it."""
    BACKOFF = "backoff"
    """A retry waits out its back-off."""
    INVALID = "invalid"
    """The job cannot run as written (unknown priority class, empty request, ...)."""


SEVERITY: dict[ReasonCode, int] = {
    ReasonCode.INVALID: 100,
    ReasonCode.POOL_NOT_ALLOWED: 90,
    ReasonCode.EXCEEDS_QUEUE_LIMIT: 80,
    ReasonCode.OUTSIDE_TIME_WINDOW: 70,
    ReasonCode.BACKOFF: 60,
    ReasonCode.WAITING_FOR_PREEMPTION: 50,
    ReasonCode.BEHIND_HIGHER_PRIORITY: 10,
    # Shortages: the one closest to success wins across pools (see
    # `allotment.scheduler.verdicts.most_relevant`).
    ReasonCode.QUOTA_EXHAUSTED: 30,
    ReasonCode.GANG_UNSATISFIABLE: 25,
    ReasonCode.NO_NODE_FITS: 20,
}
"""Higher is more severe; among pools the *least* severe shortage is reported, since it
is the one that came closest to admitting the job."""

SHORTAGES = frozenset(
    {ReasonCode.QUOTA_EXHAUSTED, ReasonCode.GANG_UNSATISFIABLE, ReasonCode.NO_NODE_FITS}
)


@dataclass(frozen=True, slots=True)
class Reason:
    """A reason code with a one-line message and structured detail."""

    code: ReasonCode
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, "detail": self.detail}
