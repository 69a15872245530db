"""The scheduler's output: one decision per job it looked at, each with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allotment.domain.reasons import Reason
from allotment.scheduler.snapshot import ReplicaPlacement


@dataclass(frozen=True, slots=True, kw_only=True)
class Admit:
    """Start ``job`` in ``pool`` with these placements. ``borrowed`` is the part of its
    request (milli-units per resource) above its queue's unused nominal quota, lent by
    ``lenders`` (the queues whose subtree covers it, nearest first)."""

    job: str
    queue: str
    pool: str
    placements: tuple[ReplicaPlacement, ...]
    borrowed: dict[str, int] = field(default_factory=dict)
    lenders: tuple[str, ...] = ()
    backfilled: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Victim:
    """A running job to preempt, and why, in words the victim's owner can read."""

    job: str
    queue: str
    cause: str
    """``within_queue``, ``reclaim`` or ``borrow_only``."""
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Preempt:
    """Preempt ``victims`` so that ``job`` fits in ``pool``; ``job`` waits with
    ``waiting_for_preemption`` until they are gone, and their resources stay reserved."""

    job: str
    queue: str
    pool: str
    victims: tuple[Victim, ...]
    reason: Reason


@dataclass(slots=True, kw_only=True)
class Decisions:
    """The result of one cycle.

    ``waiting`` holds a reason for *every* pending job that was not admitted, including
    those the cycle did not look at (``behind_higher_priority``). ``reservations`` maps a
    blocked job to the time its backfill reservation starts.
    """

    now: float
    admitted: list[Admit] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    waiting: dict[str, Reason] = field(default_factory=dict)
    reservations: dict[str, float] = field(default_factory=dict)
    queue_order: dict[str, list[str]] = field(default_factory=dict)
    """Each queue's pending jobs (ids) in the order the cycle considers them."""
    stats: dict[str, Any] = field(default_factory=dict)

    def reason_for(self, job_id: str) -> Reason | None:
        return self.waiting.get(job_id)

    def position(self, job_id: str, queue: str) -> int | None:
        """The job's 1-based place in its queue's order (a linear search: for one job)."""
        order = self.queue_order.get(queue, [])
        try:
            return order.index(job_id) + 1
        except ValueError:
            return None

    def admitted_ids(self) -> set[str]:
        return {a.job for a in self.admitted}
