"""The borrowers' turn: a head that fits only where it would borrow lets that pool's
owners go first.

A cycle takes queue heads that fit their queue's unused nominal quota before heads that
would borrow (:mod:`allotment.scheduler.ordering`). Before a head is tried, only its
quota tells whether it would borrow: a head that fits its queue's guarantee, but whose
own pools have no node with room for it, finds room only in a pool where it borrows.
Admitted there at once, it can take the room of a job of that pool's owner tried later
in the same cycle, which then reclaims it in the next one: a preemption for nothing (on
Philly, most guarantee violations). So such a head goes back among the heads that would
borrow (:attr:`~allotment.scheduler.lines.Outcome.DEFERRED`; its line waits with it)
while a queue guaranteed part of that pool still has a job to try that asks no more GPUs
than the pool has free; in the borrowers' turn it is tried again and may borrow.
"""

from __future__ import annotations

from collections.abc import Mapping

from allotment.domain.resources import GPU
from allotment.scheduler.lines import Line
from allotment.scheduler.policy import QuotaRule
from allotment.scheduler.snapshot import PendingJob
from allotment.scheduler.state import CycleState


class BorrowerTurn:
    """One cycle's heads sent back among the borrowers."""

    __slots__ = ("_lines", "_owners", "deferred")

    def __init__(self, lines: Mapping[str, Line]) -> None:
        self.deferred: set[str] = set()
        """Jobs sent back this cycle: ordered as borrowers from then on."""
        self._lines = lines
        """The cycle's lines by queue (filled before the first head is tried)."""
        self._owners: dict[str, list[Line]] | None = None

    def defers(
        self, state: CycleState, rule: QuotaRule, job: PendingJob, line: Line, pool: str
    ) -> bool:
        """Whether ``job``, the head of ``line`` that fits in ``pool``, goes back among
        the borrowers instead of starting there (each job at most once a cycle)."""
        if job.id in self.deferred:
            return False
        free = state.placer.free_gpus(pool)
        if not any(
            other is not line
            and not other.done
            and other.index < len(other.jobs)
            and other.jobs[other.index].total().get(GPU, 0) <= free
            for other in self._owners_of(pool)
        ):
            return False
        quota, name = state.quota, line.queue.name
        if not rule.borrows(quota, name, job, (pool,)) or rule.borrows(
            quota, name, job, job.pools or line.own or ()
        ):
            return False  # it would not borrow there, or it was ordered as a borrower
        self.deferred.add(job.id)
        return True

    def _owners_of(self, pool: str) -> list[Line]:
        """The lines of the queues guaranteed part of ``pool``."""
        owners = self._owners
        if owners is None:
            owners = self._owners = {}
            for line in self._lines.values():
                for named in line.queue.nominal:
                    owners.setdefault(named, []).append(line)
        return owners.get(pool, [])
