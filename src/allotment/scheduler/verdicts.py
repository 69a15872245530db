"""Verdicts: why a try of a request failed in a pool, and how long that answer holds.

A cycle that gives no explanations (the replay's, a forecast's) keeps, per queue, class
and shape, then per pool, why a try failed there with no claims and no victims taken.
It holds while the pool has not changed since: nothing ran, ended or began stopping
there (the world only fills up in between). A verdict that no node fits holds across
more than that -- across other queues' jobs ending there -- while no node of the pool
has as many whole GPUs free as one replica asks: the freed capacity is of no use to the
request, its quota can only have grown (it needs no more than it had), and, when a
victim search there had found nothing to take, nothing was added to take (no job there
became a possible victim, and none of the queue's own ended there, which could let it
reclaim). The try's bookkeeping still runs as for a fresh answer (its victim search is
counted against the cycle's bound), so the cycle decides exactly as it would have.

Of the reasons a try gathers, one per pool, :func:`most_relevant` picks the one a job
shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from allotment.domain.reasons import SEVERITY, SHORTAGES, Reason, ReasonCode
from allotment.domain.resources import GPU, MILLI
from allotment.scheduler.snapshot import PendingJob
from allotment.scheduler.state import CycleState


@dataclass(slots=True, init=False)
class Verdict:
    """Why a try failed in a pool, with the pool's counts then."""

    changed: int
    """The pool's ``CycleState.changed`` then."""
    reason: Reason
    joined: int
    """The pool's ``CycleState.joined`` then."""
    left: int
    """The queue's ``CycleState.left`` in the pool then."""
    searched: bool
    """A victim search failed there since, the pool unchanged."""
    empty: bool
    """A victim search there found nothing to take (true while ``joined`` and ``left``
    are)."""

    # Written out: compiled, it runs natively (a generated one stays interpreted).
    def __init__(
        self, changed: int, reason: Reason, joined: int, left: int, *, empty: bool = False
    ) -> None:
        self.changed, self.reason, self.joined, self.left = changed, reason, joined, left
        self.searched = False
        self.empty = empty


def verdict(state: CycleState, queue: str, pool: str, reason: Reason) -> Verdict:
    """A fresh verdict: ``reason`` is why a try of ``queue``'s just failed in ``pool``."""
    return Verdict(
        state.changed.get(pool, 0),
        reason,
        state.joined.get(pool, 0),
        state.left.get((queue, pool), 0),
    )


def recall(state: CycleState, key: tuple[object, ...], bound: int) -> dict[str, Verdict]:
    """The verdicts per pool of tries asking ``key`` (queue, class value, shape), kept in
    ``state`` (all are forgotten when ``bound`` keys are kept: memory stays bounded)."""
    if len(state.verdicts) >= bound:
        state.verdicts.clear()
    return state.verdicts.setdefault(key, {})


def holding(
    state: CycleState, known: Verdict | None, queue: str, pool: str, job: PendingJob
) -> Verdict | None:
    """The verdict a try of ``job`` (of ``queue``) takes in ``pool`` now, from ``known``:
    itself while the pool is unchanged, a fresh copy where only no node fits still (its
    victim search to be repeated, or known to find nothing), else None (try again)."""
    if known is None:
        return None
    changed = state.changed.get(pool, 0)
    if known.changed == changed:
        return known
    if (
        known.reason.code is not ReasonCode.NO_NODE_FITS
        or known.joined != state.joined.get(pool, 0)
        or known.left != state.left.get((queue, pool), 0)
    ):
        return None
    need = whole_gpus_per_replica(job)
    if not need or state.placer.most_whole_free(pool) * MILLI >= need:
        return None
    return Verdict(changed, known.reason, known.joined, known.left, empty=known.empty)


def whole_gpus_per_replica(job: PendingJob) -> int:
    """The fewest GPUs (milli) any replica of ``job`` asks, when every replica asks
    whole GPUs; 0 otherwise (a fraction may fit on a device in use)."""
    need = 0
    for group in job.replicas:
        gpu = group.resources.get(GPU, 0)
        if gpu <= 0 or gpu % MILLI:
            return 0
        need = gpu if not need else min(need, gpu)
    return need


def most_relevant(reasons: list[Reason]) -> Reason:
    """Pick the one reason to show from several (e.g. one per pool tried).

    A problem with the job or a policy gate outranks a shortage; among shortages the
    least severe (closest to admission) wins, earlier pools first on ties.
    """
    if not reasons:
        raise ValueError("most_relevant needs at least one reason")
    # One pass (a cycle asks this for most jobs it tries): the first gate of the highest
    # severity, else the first shortage of the lowest.
    gate: Reason | None = None
    shortage: Reason | None = None
    for reason in reasons:
        severity = SEVERITY[reason.code]
        if reason.code in SHORTAGES:
            if shortage is None or severity < SEVERITY[shortage.code]:
                shortage = reason
        elif gate is None or severity > SEVERITY[gate.code]:
            gate = reason
    best = gate if gate is not None else shortage
    assert best is not None
    return best
