"""Who borrows from whom: each queue's use beyond its quota attributed to the unused
quota it takes.

The quota tree (:mod:`allotment.scheduler.quota`) knows how much each queue uses
and how much of its nominal quota it leaves unused for others
(:meth:`~allotment.scheduler.quota.QuotaTree.lendable`), but borrowing has no single
lender: a queue above its quota uses what its whole cohort leaves unused. This module
attributes it, per pool and resource, nearest cohort first:

* a leaf uses ``usage - nominal`` beyond its quota (all it uses where it names none)
  and leaves ``lendable`` unused for others (its unused nominal, less what its lending
  limit keeps back);
* at each inner queue, and at the pool's root, what its children use beyond their
  quotas is covered by what the others leave unused and by the queue's own unassigned
  quota (its nominal less what its children are assigned; at the root, the pool's
  capacity no queue is assigned). Each borrower's part is split over those lenders in
  proportion to what each leaves unused;
* what is left goes up a level: borrowing not covered yet, and unused quota not lent
  yet (at most what the inner queue itself leaves unused). An inner queue that names no
  quota of the resource passes both up as they are.

Amounts are milli-units, as floats: a split is rarely whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from allotment.domain.resources import GPU
from allotment.scheduler.quota import ROOT, QuotaTree
from allotment.scheduler.snapshot import Snapshot
from allotment.scheduler.state import CycleState

UNASSIGNED = ROOT
"""The lender of a pool's capacity that no queue is assigned."""

_TINY = 1e-6


@dataclass(frozen=True, slots=True)
class Loan:
    """``borrower`` (a leaf queue) uses ``amount`` of ``lender``'s unused quota: a
    queue's nominal quota its subtree leaves unused, an inner queue's quota it has not
    assigned to its children, or :data:`UNASSIGNED` capacity of ``pool``."""

    borrower: str
    lender: str
    pool: str
    resource: str
    amount: float


def loans(tree: QuotaTree, resource: str = GPU) -> list[Loan]:
    """Every loan of ``resource`` in every pool of ``tree``, as it is used now."""
    out: list[Loan] = []
    for pool in tree.pools:
        _Pool(tree, pool, resource, out).walk(ROOT)
    return out


def loans_now(snapshot: Snapshot, resource: str = GPU) -> list[Loan]:
    """:func:`loans` with the quota usage of ``snapshot``'s running jobs."""
    return loans(CycleState.from_snapshot(snapshot).quota, resource)


class _Pool:
    def __init__(self, tree: QuotaTree, pool: str, resource: str, out: list[Loan]) -> None:
        self.tree, self.pool, self.resource, self.out = tree, pool, resource, out

    def walk(self, queue: str) -> tuple[dict[str, float], dict[str, float], float]:
        """For ``queue``'s subtree: the borrowing it still needs covered (per leaf), the
        unused quota it still leaves to others (per lender), and the nominal quota
        assigned within it."""
        tree, pool, resource = self.tree, self.pool, self.resource
        nominal = tree.nominal(queue, pool)
        own = nominal.get(resource, 0)
        children = tree.children(queue)
        if queue != ROOT and not children:
            used = tree.usage(queue, pool).get(resource, 0)
            spare = tree.lendable(queue, pool, resource)
            return (
                {queue: float(used - own)} if used > own else {},
                {queue: float(spare)} if spare > 0 else {},
                float(own),
            )
        over: dict[str, float] = {}
        spare_of: dict[str, float] = {}
        assigned = 0.0
        for child in children:
            child_over, child_spare, child_assigned = self.walk(child)
            over.update(child_over)
            spare_of.update(child_spare)
            assigned += child_assigned
        if queue != ROOT and resource not in nominal:
            return over, spare_of, assigned  # no quota of its own: it changes nothing
        if own - assigned > _TINY:
            spare_of[queue] = own - assigned
        self._settle(over, spare_of)
        if queue != ROOT:
            room = float(tree.lendable(queue, pool, resource))
            total = sum(spare_of.values())
            if total > room:
                spare_of = {k: v * room / total for k, v in spare_of.items() if v * room > 0}
        return over, spare_of, float(own)

    def _settle(self, over: dict[str, float], spare: dict[str, float]) -> None:
        """Cover ``over`` from ``spare`` as far as it goes, proportionally; both are
        left holding what remains."""
        need, have = sum(over.values()), sum(spare.values())
        if need <= _TINY or have <= _TINY:
            return
        covered = min(need, have)
        for borrower, amount in over.items():
            part = amount * covered / need
            for lender, unused in spare.items():
                self.out.append(
                    Loan(
                        borrower=borrower,
                        lender=lender,
                        pool=self.pool,
                        resource=self.resource,
                        amount=part * unused / have,
                    )
                )
        for side, total in ((over, need), (spare, have)):
            for key in list(side):
                side[key] *= 1 - covered / total
                if side[key] <= _TINY:
                    del side[key]
