"""Backfill reservations (EASY backfill, after Slurm's).

When a job cannot start for lack of free capacity, it gets a *reservation*: the earliest
time its placement frees up if the running jobs end at their expected (else maximum)
end times, and the capacity on each node it will then use. Later jobs may still start
if they are bounded to end before the reservation begins, or if they fit beside the
reserved capacity (:meth:`Reservations.claims_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from allotment.domain.reasons import Reason, ReasonCode
from allotment.scheduler.placement import NodeState, per_node
from allotment.scheduler.snapshot import PendingJob

if TYPE_CHECKING:
    from allotment.scheduler.state import CycleState, Holder

MAX_PLACEMENT_TRIES = 64


@dataclass(slots=True)
class Reservation:
    job: str
    pool: str
    start: float
    claims: dict[str, dict[str, int]]


@dataclass(slots=True)
class Reservations:
    """The reservations made so far in a cycle and their merged node claims."""

    items: list[Reservation] = field(default_factory=list)
    merged: dict[str, dict[str, int]] = field(default_factory=dict)
    earliest: float = math.inf

    def add(self, reservation: Reservation) -> None:
        self.items.append(reservation)
        self.earliest = min(self.earliest, reservation.start)
        for node, claim in reservation.claims.items():
            bucket = self.merged.setdefault(node, {})
            for key, amount in claim.items():
                bucket[key] = bucket.get(key, 0) + amount

    def forget(self, job: str, starts: dict[str, float] | None = None) -> None:
        """Drop the reservation of ``job`` (if any) and rebuild the merged claims; and its
        start from ``starts`` (a cycle's decisions' reservations), when given."""
        if starts is not None:
            starts.pop(job, None)
        kept = [r for r in self.items if r.job != job]
        if len(kept) == len(self.items):
            return
        self.items, self.merged, self.earliest = [], {}, math.inf
        for reservation in kept:
            self.add(reservation)

    def claims(self) -> dict[str, dict[str, int]] | None:
        """Every reservation's claims together (None when there are none)."""
        return self.merged if self.items else None

    def claims_for(self, now: float, bound: float | None) -> dict[str, dict[str, int]] | None:
        """The claims a job must leave free: none if it surely ends before every
        reservation starts (``bound`` = its maximum runtime)."""
        if not self.items:
            return None
        if bound is not None and now + bound <= self.earliest:
            return None
        return self.merged

    def claims_before(
        self, job: str, now: float, bound: float | None
    ) -> dict[str, dict[str, int]] | None:
        """The claims ``job`` must leave free when it is tried again after its own
        reservation was made: those of the reservations made before its own (all of
        them if it has none), under :meth:`claims_for`'s rule."""
        mine = next((i for i, r in enumerate(self.items) if r.job == job), None)
        if mine is None:
            return self.claims_for(now, bound)
        earlier = Reservations()
        for reservation in self.items[:mine]:
            earlier.add(reservation)
        return earlier.claims_for(now, bound)

    def held_back(self, pool: str, queue: str) -> Reason:
        """Why a job of ``queue`` that would fit in ``pool`` now waits: the claims."""
        return Reason(
            ReasonCode.BEHIND_HIGHER_PRIORITY,
            f"it would fit in pool {pool} now, but the capacity is reserved for "
            f"{self.items[0].job}, which goes first; it may start earlier only if its "
            "max_runtime ends before that reservation",
            {"pool": pool, "reserved_for": [r.job for r in self.items], "queue": queue},
        )


def plan_reservation(state: CycleState, job: PendingJob, pool: str) -> Reservation | None:
    """When and where ``job`` could start in ``pool`` as running jobs end (expected,
    else maximum, end first); None if it cannot be found within the look-ahead bounds,
    or only once jobs with no known end are gone (its start is unknown).

    Within a cycle the answer depends only on the pool's running jobs and the job's
    shape: it is worked out once per shape until the pool changes."""
    if not state.known_end.get(pool):
        return None  # no running job there has a known end (a trace with no run times)
    version = state.placer.version(pool)
    key = ("reservation", pool, version, job.shape())
    if key in state.cycle_cache:
        known: Reservation | None = state.cycle_cache[key]
    else:
        holders = _ending_order(state, pool, version)
        if job.replica_count == 1:
            known = _one_replica(state, job, pool, holders)
        else:
            known = _gang(state, job, pool, holders)
        state.cycle_cache[key] = known
    if known is None:
        return None
    claims = {node: dict(claim) for node, claim in known.claims.items()}
    return Reservation(job=job.id, pool=pool, start=known.start, claims=claims)


def _ending_order(state: CycleState, pool: str, version: int) -> list[Holder]:
    """The pool's running jobs with a known end, expected (else maximum) end first, then
    latest start. Those with no known end are left out: a plan stops where they begin."""
    key = ("ending", pool, version)
    order: list[Holder] | None = state.cycle_cache.get(key)
    if order is None:
        order = [h for h in state.by_pool.get(pool, {}).values() if h.end_bound is not None]
        order.sort(key=_ending_key)
        state.cycle_cache[key] = order
    return order


def _ending_key(holder: Holder) -> tuple[float, float]:
    assert holder.end_bound is not None
    return (holder.end_bound, -holder.start_time)


def _gang(
    state: CycleState, job: PendingJob, pool: str, holders: list[Holder]
) -> Reservation | None:
    if not holders:
        return None  # no running job there has a known end
    scratch = state.placer.scratch(pool)
    tries = 0
    for holder in holders:
        scratch.release(holder.placements)
        if scratch.free_gpus(pool) < job.gpus:
            continue
        tries += 1
        if tries > MAX_PLACEMENT_TRIES:
            return None
        placed = scratch.place(pool, job.replicas)
        if placed.ok:
            return Reservation(
                job=job.id,
                pool=pool,
                start=_start(state, holder),
                claims=per_node(placed.placements),
            )
    return None


def _one_replica(
    state: CycleState, job: PendingJob, pool: str, holders: list[Holder]
) -> Reservation | None:
    """One replica needs one node: watch only the nodes that ending jobs free."""
    request = job.replicas[0].resources
    copies: dict[str, NodeState] = {}
    for holder in holders:
        for placement in holder.placements:
            node = copies.get(placement.node)
            if node is None:
                base = state.placer.nodes.get(placement.node)
                if base is None:
                    continue
                node = copies[placement.node] = base.twin()
            node.apply(placement, 1)
        for placement in holder.placements:
            node = copies.get(placement.node)
            if node is not None and node.fits(request):
                return Reservation(
                    job=job.id,
                    pool=pool,
                    start=_start(state, holder),
                    claims={node.name: dict(request)},
                )
    return None


def _start(state: CycleState, holder: Holder) -> float:
    assert holder.end_bound is not None
    return max(state.now, holder.end_bound)
