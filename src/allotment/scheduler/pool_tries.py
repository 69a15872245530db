"""Trying one job in one pool: its quota first, then a placement on the pool's nodes.

What a cycle learns on the way is kept: a shape that fits on no node of a pool fails
again for the rest of the cycle (the world only fills up during one), and -- when the
cycle gives no explanations, as in the replay -- in later cycles too, until running jobs
give capacity back in that pool.
"""

from __future__ import annotations

from allotment.domain.reasons import Reason
from allotment.scheduler.placement import Claims, PlacementResult
from allotment.scheduler.quota import ROOT, QuotaCheck
from allotment.scheduler.snapshot import PendingJob
from allotment.scheduler.state import MAX_REMEMBERED, CycleState


class PoolTries:
    """One cycle's tries of jobs in pools, and the placements known not to fit."""

    def __init__(self, state: CycleState, *, remember: bool) -> None:
        self.state = state
        self.remember = remember
        """Whether a failed placement is known in later cycles (until capacity returns)."""
        self.no_fit: dict[tuple[object, ...], Reason] = {}
        self._claimed: dict[tuple[object, ...], frozenset[object]] = {}
        self._no_victims: set[tuple[object, ...]] = set()
        """Victim searches that failed this cycle."""

    def attempt(
        self,
        job: PendingJob,
        queue: str,
        pool: str,
        shape: str,
        claims: Claims | None,
        held_back: list[str],
    ) -> tuple[PlacementResult, QuotaCheck] | Reason:
        """Where ``job`` of ``queue`` would run in ``pool`` now, with its quota answer;
        else why it may not (and, when only the claims stand in the way, ``pool`` joins
        ``held_back``)."""
        state = self.state
        # Quota first, whatever is known about the nodes: a remembered failure must not
        # change which reason (and so which outcome) the job gets.
        check = state.quota.check(queue, pool, job)
        if not check.fits and check.blocking_queue != ROOT:
            return check.reason(pool, queue)  # out of its own quota or what it may borrow
        known = self.known(pool, shape)
        if known is not None:
            return known  # it fits on no node even with nothing claimed
        key = (pool, shape, True)
        cached = self.no_fit.get(key) if claims is not None else None
        if cached is not None:
            placed = PlacementResult(reason=cached)
        else:
            side = state.side(queue, pool)
            placed = state.placer.place(pool, job.replicas, claims=claims, side=side)
        if placed.ok:
            if not check.fits:
                # Free nodes, but held back for other queues' unlent guarantees; when the
                # pool itself is full, the placement's reason says it better.
                return check.reason(pool, queue)
            return placed, check
        assert placed.reason is not None
        if claims is None:
            self._learn(pool, shape, placed.reason)
            return placed.reason
        self.no_fit[key] = placed.reason
        unclaimed = state.placer.place(pool, job.replicas)
        if not unclaimed.ok:
            # It would not fit with nothing claimed either: that is the reason.
            assert unclaimed.reason is not None
            self._learn(pool, shape, unclaimed.reason)
            return unclaimed.reason
        if not check.fits:
            # Only the claims stand in the nodes' way, and without them the quota would
            # still say no: its reason, as when nothing is claimed.
            return check.reason(pool, queue)
        held_back.append(pool)
        return placed.reason

    def known(self, pool: str, shape: str) -> Reason | None:
        """Why a job of ``shape`` fits on no node of ``pool`` even without claims, if
        known: found this cycle, or (remembering) in an earlier cycle with no capacity
        given back in the pool since."""
        key = (pool, shape, False)
        found = self.no_fit.get(key)
        if found is not None or not self.remember:
            return found
        lasting = self.state.no_fit.get((pool, shape))
        if lasting is not None and lasting[0] == self.state.released.get(pool, 0):
            reason: Reason = lasting[1]
            self.no_fit[key] = reason
            return reason
        return None

    def _learn(self, pool: str, shape: str, reason: Reason) -> None:
        self.no_fit[(pool, shape, False)] = reason
        self.state.no_fit[(pool, shape)] = (self.state.released.get(pool, 0), reason)

    def search(
        self,
        queue: str,
        pool: str,
        value: int,
        shape: str,
        claims: Claims | None,
        version: int,
    ) -> tuple[object, ...]:
        """What decides a victim search for a job of ``queue``, of class ``value`` and
        ``shape``, in ``pool``, leaving ``claims`` (the cycle's ``version``-th set of
        reservations) free."""
        claimed = None if claims is None else self._held(pool, claims, version)
        return (queue, pool, value, shape, claimed)

    def searched(self, search: tuple[object, ...], pool: str) -> bool:
        """Whether ``search`` is known to fail: it failed in this cycle (the world only
        fills up), or in an earlier one and nothing ran, ended or began stopping in
        ``pool`` since."""
        if search in self._no_victims:
            return True
        failed_at = self.state.no_victims.get(search)
        return failed_at is not None and failed_at == self.state.changed.get(pool, 0)

    def search_failed(self, search: tuple[object, ...], pool: str, *, remember: bool) -> None:
        """``search`` found no victims; ``remember``: in later cycles too, until ``pool``
        changes (only a search with no victims taken before it in the cycle)."""
        self._no_victims.add(search)
        if remember:
            state = self.state
            if len(state.no_victims) >= MAX_REMEMBERED:
                state.no_victims.clear()  # memory stays bounded
                state.verdicts.clear()  # theirs rely on these searches
            state.no_victims[search] = state.changed.get(pool, 0)

    def _held(self, pool: str, claims: Claims, version: int) -> frozenset[object]:
        """What ``claims`` (the cycle's ``version``-th set of reservations) hold on
        ``pool``'s nodes, hashable: a victim search that failed leaving the same claims
        free fails again until the pool changes."""
        key = (pool, version, id(claims))
        known = self._claimed.get(key)
        if known is None:
            nodes = self.state.placer.nodes
            known = self._claimed[key] = frozenset(
                (node, *sorted(held.items()))
                for node, held in claims.items()
                if node in nodes and nodes[node].pool == pool
            )
        return known
