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
while a queue guaranteed part of that pool still has a job to try that could take that
room: one that asks no more GPUs than the pool has free, or one that fits its queue's
guarantee there, which the head would leave lent out (the owner takes back what others
borrow there and the free room with it: a gang of the owner that needs more than is
free, say); in the borrowers' turn it is tried again and may borrow.

The owner's job, tried first, may still find no node: the pool's free GPUs are spread
over nodes that each keep a few of its own queue's small jobs. With no other queue in
the pool it may not move them (:meth:`~allotment.scheduler.victims.VictimRule.may_move`:
moves are for a queue that others hold part of its guarantee from), and it waits for
one of them to end. But when a borrower then takes that free room, the pool is lent out,
and the next cycle reclaims the borrower and moves the small jobs all the same: a
preemption for nothing again, and the queue owed its guarantee in between (on Philly,
most of the guarantee violations left). So such a job is remembered as stuck
(:meth:`BorrowerTurn.stuck`), and before a job of another queue takes room in that pool
that would leave it lent out, the stuck job is tried again with moves allowed
(:meth:`BorrowerTurn.owners_first`). Where the moves make room, the rest of the pool's
free room is kept this cycle for the jobs they restart: no job that would take part of
the owner's guarantee starts there (:meth:`BorrowerTurn.kept_for`, the reason says for
whom). Where they cannot, the borrower starts as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from allotment.domain.cluster import PriorityClass
from allotment.domain.reasons import Reason, ReasonCode
from allotment.domain.resources import GPU
from allotment.scheduler.lines import Line
from allotment.scheduler.policy import QuotaRule
from allotment.scheduler.quota import QuotaTree
from allotment.scheduler.snapshot import PendingJob
from allotment.scheduler.state import CycleState
from allotment.scheduler.victims import VictimRule


class BorrowerTurn:
    """One cycle's heads sent back among the borrowers."""

    __slots__ = ("_kept", "_lines", "_owners", "_stuck", "deferred")

    def __init__(self, lines: Mapping[str, Line]) -> None:
        self.deferred: set[str] = set()
        """Jobs sent back this cycle: ordered as borrowers from then on."""
        self._lines = lines
        """The cycle's lines by queue (filled before the first head is tried)."""
        self._owners: dict[str, list[Line]] | None = None
        self._kept: dict[str, tuple[str, Reason]] = {}
        """Per pool whose owner moved jobs this cycle to make room: that owner, and why
        jobs that would take part of its guarantee do not start there this cycle."""
        self._stuck: dict[str, dict[str, tuple[PendingJob, Line, PriorityClass]]] = {}
        """Per pool, per queue guaranteed part of it, the first job of the queue that
        found no room this cycle though within that guarantee, while no other queue
        held part of it (so it could not move other jobs to make room)."""

    def defers(
        self, state: CycleState, rule: QuotaRule, job: PendingJob, line: Line, pool: str
    ) -> bool:
        """Whether ``job``, the head of ``line`` that fits in ``pool``, goes back among
        the borrowers instead of starting there (each job at most once a cycle)."""
        if job.id in self.deferred:
            return False
        quota, name = state.quota, line.queue.name
        free, asks = state.placer.free_gpus(pool), job.total()
        if not any(
            other is not line
            and not other.done
            and other.index < len(other.jobs)
            and _may_take(quota, other.queue.name, other.jobs[other.index], pool, free, asks)
            for other in self._owners_of(pool)
        ):
            return False
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

    def stuck(
        self,
        state: CycleState,
        rule: VictimRule,
        job: PendingJob,
        line: Line,
        klass: PriorityClass,
        pools: Iterable[str],
    ) -> None:
        """``job`` of ``line`` (of class ``klass``) found no room in ``pools`` and no
        victims: remembered in those of them where it is within its queue's guarantee
        but may not move jobs only because nobody else holds part of it, the first such
        job of its queue only."""
        quota, queue, total = state.quota, line.queue, job.total()
        name = queue.name
        for pool in pools:
            if (
                pool in queue.nominal
                and quota.within_nominal(name, pool, total)
                and not quota.lent_out(name, pool)
                and rule.may_move(state, queue, pool, True)
            ):
                self._stuck.setdefault(pool, {}).setdefault(name, (job, line, klass))

    def owners_first(
        self, state: CycleState, queue: str, pool: str, total: Mapping[str, int]
    ) -> list[tuple[PendingJob, Line, PriorityClass]]:
        """The stuck jobs of ``pool`` (:meth:`stuck`) whose queues a ``total`` job of
        ``queue`` admitted there would leave owed their guarantee (the pool lent out):
        each is given once a cycle, to be tried again with moves allowed before that job
        is admitted."""
        stuck = self._stuck.get(pool)
        if not stuck:
            return []
        quota = state.quota
        out = []
        for name in list(stuck):
            if name == queue:
                continue
            if quota.lent_out(name, pool):
                del stuck[name]  # lent out already: its own searches may move jobs
            elif quota.lent_out(name, pool, total):
                out.append(stuck.pop(name))
        return out

    def keep(self, pool: str, queue: str, job: str) -> None:
        """``job`` of ``queue`` moved jobs in ``pool`` this cycle: the room they need
        there is not lent to other queues in it."""
        self._kept.setdefault(
            pool,
            (
                queue,
                Reason(
                    ReasonCode.BEHIND_HIGHER_PRIORITY,
                    f"it would fit in pool {pool} now, but queue {queue} is moving jobs "
                    f"there to make room for {job} within its guarantee; they go first",
                    {"pool": pool, "owner": queue, "reserved_for": [job]},
                ),
            ),
        )

    def kept_for(
        self, state: CycleState, pool: str, queue: str, total: Mapping[str, int]
    ) -> Reason | None:
        """Why a ``total`` job of ``queue`` does not start in ``pool`` this cycle: it
        would take part of the guarantee of a queue that moved jobs there (:meth:`keep`)."""
        kept = self._kept.get(pool)
        if kept is None or kept[0] == queue or not state.quota.lent_out(kept[0], pool, total):
            return None
        return kept[1]


def _may_take(
    quota: QuotaTree, owner: str, head: PendingJob, pool: str, free: int, asks: Mapping[str, int]
) -> bool:
    """Whether ``owner``'s next job ``head`` may take the room a job asking ``asks``
    would take in ``pool``: it asks no more GPUs than the pool has ``free``, or it fits
    its queue's guarantee there, which that job would leave lent out (so the owner
    could take it back at once)."""
    wants = head.total()
    if wants.get(GPU, 0) <= free:
        return True
    return quota.within_nominal(owner, pool, wants) and quota.lent_out(owner, pool, asks)
