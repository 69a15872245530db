"""The policy seam: where the replay presets differ, one small strategy per concern.

A :class:`~allotment.scheduler.snapshot.SchedulerPolicy` is what a caller asks for: a
name, the switches a preset sets and the numeric bounds of a cycle. :func:`compose`
turns it into :class:`Rules` -- five plain objects, built once per
:class:`~allotment.scheduler.state.CycleState` -- and the cycle asks them instead of
reading switches; :func:`compose` is the only place that reads them. The model is
KAI-Scheduler's plugin hooks and Kueue's preemption strategies, without a registry: a
preset is a composition, nothing is looked up by name. The concerns and their
strategies:

- **order** (:class:`QueueOrder`), which queue's head goes next among equal priority
  classes: :class:`SubmitOrder` (first submitted, first served, across queues) or
  :class:`FairShareOrder` (lowest weighted dominant-resource share, aged by waiting).
- **victims** (:class:`~allotment.scheduler.victims.VictimRule`, in
  :mod:`allotment.scheduler.victims`), which running jobs a preemptor may take and in
  what order: ``NoPreemption``; ``ReclaimOnly`` (a queue within its nominal quota takes
  back what others borrow, and ``borrow_only`` jobs of other queues);
  ``PriorityAndReclaim`` (that, and lower priorities of its own queue);
  ``WithinQueueOnly`` (lower priorities of its own queue only: no preset uses it).
- **quota** (:class:`QuotaRule`), what a queue may use beyond its own guarantee:
  :class:`IsolatedQuota` (its own nominal quota only, anywhere on the pool's nodes) or
  :class:`BorrowingQuota` (idle quota of others through the tree, borrowers kept apart
  from owners on the nodes and tried where they are guaranteed first).
- **reservations** (:class:`ReservationRule`), whether a job short of free capacity holds
  a backfill reservation: :class:`NoReservations` or :class:`Backfill`.
- **line** (:class:`LineRule`), whether a waiting head ends its queue's line for the
  cycle: :class:`BestEffortFifo` (the jobs behind it are tried, unless the queue says
  ``queueing: strict`` and the head is short of quota), :class:`StrictFifo` (a head
  that waits for quota or capacity ends the line) or :class:`BackfillFifo` (one short of
  quota ends it; behind one short of capacity, jobs backfill around its reservation).

Pure like the rest of the core: no clock, no I/O; the numbers a strategy needs
(``aging_horizon``, ``max_reservations``) are given to it when it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from allotment.domain.cluster import Queue
from allotment.domain.reasons import Reason, ReasonCode
from allotment.domain.resources import GPU, format_quantity
from allotment.scheduler.backfill import Reservation, plan_reservation
from allotment.scheduler.lines import Outcome
from allotment.scheduler.ordering import QueueKey
from allotment.scheduler.placement import GUEST, OWNER, Placer
from allotment.scheduler.quota import ROOT, Amounts, QuotaTree
from allotment.scheduler.snapshot import PendingJob, SchedulerPolicy
from allotment.scheduler.victims import (
    NoPreemption,
    PriorityAndReclaim,
    ReclaimOnly,
    SparingCovered,
    VictimRule,
    WithinQueueOnly,
)

if TYPE_CHECKING:
    from allotment.scheduler.state import CycleState


# ---------------------------------------------------------------------------- order


class QueueOrder(Protocol):
    """Which queue's head goes next: the heap key of a queue by its head job."""

    def key(
        self,
        job: PendingJob,
        value: int,
        queue: str,
        borrows: bool,
        now: float,
        share: Callable[[str], float],
    ) -> QueueKey:
        """Lower goes first. ``value`` is the head's class value, ``borrows`` whether it
        would need borrowed quota everywhere (such heads go after those that would not,
        as in Kueue), ``share`` gives a queue's weighted dominant-resource share."""
        ...


@dataclass(frozen=True, slots=True)
class SubmitOrder:
    """Equal priority classes in submission order across queues."""

    def key(
        self,
        job: PendingJob,
        value: int,
        queue: str,
        borrows: bool,
        now: float,
        share: Callable[[str], float],
    ) -> QueueKey:
        return (1 if borrows else 0, -value, job.submit_time, job.submit_time, job.id)


@dataclass(frozen=True, slots=True)
class FairShareOrder:
    """Equal priority classes by weighted dominant-resource share (a queue below its
    guarantee before one above it), less ``wait / aging_horizon`` so nobody starves."""

    aging_horizon: float

    def key(
        self,
        job: PendingJob,
        value: int,
        queue: str,
        borrows: bool,
        now: float,
        share: Callable[[str], float],
    ) -> QueueKey:
        age = 0.0
        if self.aging_horizon > 0:
            age = max(0.0, now - job.submit_time) / self.aging_horizon
        return (1 if borrows else 0, -value, share(queue) - age, job.submit_time, job.id)


# ---------------------------------------------------------------------------- quota


class QuotaRule(Protocol):
    """What a queue may use beyond its own guarantee, and what follows from it: where
    its jobs are tried, in what order, and on which side of a pool's nodes they run."""

    def limit(self, queue: Queue, pool: str) -> Amounts:
        """The most ``queue``'s subtree may use in ``pool`` at its own level of the
        quota tree (``{}``: no limit of its own; ``{"*": 0}``: nothing at all)."""
        ...

    def ceiling(self, queue: Queue, pools: list[str], total: Mapping[str, int]) -> Reason | None:
        """Why a job of ``total`` can never fit ``queue``'s quota in any of ``pools``
        (limits alone, whatever else runs), or None."""
        ...

    def pools(self, queue: Queue, allowed: list[str]) -> tuple[list[str], int]:
        """The pools the queue's jobs are tried in, and how many of them, first, hold a
        guaranteed quota of the queue."""
        ...

    def try_order(self, placer: Placer, own: Sequence[str], pools: list[str]) -> list[str]:
        """The order a job naming no pools tries ``pools`` in (``own``: the queue's
        guaranteed pools)."""
        ...

    def borrows(self, quota: QuotaTree, queue: str, job: PendingJob, pools: Iterable[str]) -> bool:
        """Whether ``job`` would need borrowed quota in every one of ``pools``."""
        ...

    def side(self, state: CycleState, queue: str, pool: str) -> int | None:
        """Which nodes of ``pool`` ``queue``'s jobs keep to: :data:`OWNER`, :data:`GUEST`
        or None (anywhere)."""
        ...


def _too_large(queue: Queue, pools: list[str], total: Mapping[str, int]) -> Reason:
    return Reason(
        ReasonCode.EXCEEDS_QUEUE_LIMIT,
        f"this job is larger than queue {queue.name}'s quota (with its borrowing "
        f"limit) could ever allow in pool(s) {', '.join(pools)}",
        {
            "queue": queue.name,
            "pools": pools,
            "requested": {k: format_quantity(k, v) for k, v in total.items()},
        },
    )


@dataclass(frozen=True, slots=True)
class IsolatedQuota:
    """Every leaf queue keeps to the nominal quota it names, and to nothing of a pool
    where it names none: a static partition. Nobody borrows, so nobody is a guest."""

    def limit(self, queue: Queue, pool: str) -> Amounts:
        if not queue.is_leaf:
            return {}
        nominal = queue.nominal.get(pool)
        return dict(nominal.as_dict()) if nominal is not None else {"*": 0}

    def ceiling(self, queue: Queue, pools: list[str], total: Mapping[str, int]) -> Reason | None:
        for pool in pools:
            nominal = queue.nominal.get(pool)
            if nominal is None:
                continue
            if all(total.get(k, 0) <= v for k, v in nominal.as_dict().items()):
                return None
        if not any(queue.nominal.get(p) for p in pools):
            return Reason(
                ReasonCode.EXCEEDS_QUEUE_LIMIT,
                f"queue {queue.name} has no quota in pool(s) {', '.join(pools)} and "
                "borrowing is off",
                {"queue": queue.name, "pools": pools},
            )
        return _too_large(queue, pools, total)

    def pools(self, queue: Queue, allowed: list[str]) -> tuple[list[str], int]:
        # Only where the queue names a quota (it may use nothing elsewhere), unless it
        # names none: then every open pool, so that its jobs are told why they wait.
        named = [p for p in allowed if p in queue.nominal]
        return (named or allowed), 0

    def try_order(self, placer: Placer, own: Sequence[str], pools: list[str]) -> list[str]:
        return pools

    def borrows(self, quota: QuotaTree, queue: str, job: PendingJob, pools: Iterable[str]) -> bool:
        return False

    def side(self, state: CycleState, queue: str, pool: str) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class BorrowingQuota:
    """Queues use idle quota of others through the tree, within borrowing and lending
    limits; a job uses its own guarantee before it borrows, borrows where capacity is
    idlest, and borrowers keep off the nodes of the pool's owners (reclaim evicts them)."""

    def limit(self, queue: Queue, pool: str) -> Amounts:
        borrow = queue.spec.borrowing_limit or {}
        if pool not in borrow:
            return {}
        nominal = queue.nominal.get(pool)
        named = nominal.as_dict() if nominal is not None else {}
        return {r: named.get(r, 0) + amount for r, amount in borrow[pool].items()}

    def ceiling(self, queue: Queue, pools: list[str], total: Mapping[str, int]) -> Reason | None:
        spec = queue.spec
        for pool in pools:
            if not (spec.borrowing_limit and pool in spec.borrowing_limit):
                return None  # no limit on borrowing there
            nominal = queue.nominal.get(pool)
            ceiling = {
                k: (nominal[k] if nominal else 0) + v for k, v in spec.borrowing_limit[pool].items()
            }
            if all(total.get(k, 0) <= v for k, v in ceiling.items()):
                return None
        return _too_large(queue, pools, total)

    def pools(self, queue: Queue, allowed: list[str]) -> tuple[list[str], int]:
        named = [p for p in allowed if p in queue.nominal]
        guaranteed = [p for p in named if any(queue.nominal[p].as_dict().values())]
        return guaranteed + [p for p in allowed if p not in guaranteed], len(guaranteed)

    def try_order(self, placer: Placer, own: Sequence[str], pools: list[str]) -> list[str]:
        # Guaranteed pools first, then the pools to borrow from, freest first: idle
        # capacity is the least likely to be reclaimed soon.
        rest = [p for p in pools if p not in own]
        if len(rest) < 2:
            return pools
        rest.sort(key=placer.free_gpus, reverse=True)  # stable: ties keep their order
        return [p for p in pools if p in own] + rest

    def borrows(self, quota: QuotaTree, queue: str, job: PendingJob, pools: Iterable[str]) -> bool:
        total, named = job.total(), quota.named_pools(queue)
        return not any(quota.within_nominal(queue, p, total) for p in pools if p in named)

    def side(self, state: CycleState, queue: str, pool: str) -> int | None:
        key = ("side", queue, pool)
        known: int | None = state.capacity_cache.get(key, -1)
        if known == -1:
            leaf = state.cluster.queues.get(queue)
            nominal = leaf.nominal.get(pool) if leaf is not None else None
            owns = nominal is not None and nominal.as_dict().get(GPU, 0) > 0
            known = state.capacity_cache[key] = OWNER if owns else GUEST
        return known


# --------------------------------------------------------------------- reservations


class ReservationRule(Protocol):
    """Whether a job that waits for free capacity holds a backfill reservation."""

    def reserve(
        self, state: CycleState, job: PendingJob, queue: str, pools: list[str], held: int
    ) -> Reservation | None:
        """The reservation ``job`` of ``queue`` gets in the first of ``pools`` that can
        give it one, ``held`` reservations having been given this cycle; or None."""
        ...

    def ripe_at(self, job: PendingJob) -> float | None:
        """The time from which ``job``'s wait no longer keeps it from a reservation
        (None: its wait never does)."""
        ...


@dataclass(frozen=True, slots=True)
class NoReservations:
    """Nobody holds capacity for later: whatever fits now starts."""

    def reserve(
        self, state: CycleState, job: PendingJob, queue: str, pools: list[str], held: int
    ) -> Reservation | None:
        return None

    def ripe_at(self, job: PendingJob) -> float | None:
        return None


@dataclass(frozen=True, slots=True)
class Backfill:
    """EASY backfill: up to ``most`` jobs per cycle that are short of capacity (not of
    quota, and not borrowing: reclaim may evict a borrower at once) and have waited at
    least ``after`` seconds hold a reservation; the jobs behind them start only where
    they do not delay it. A reservation needs a start: when no job it waits for has an
    expected or maximum end, none is made (it would hold capacity idle for an unknown
    time)."""

    most: int
    after: float = 0.0

    def reserve(
        self, state: CycleState, job: PendingJob, queue: str, pools: list[str], held: int
    ) -> Reservation | None:
        if held >= self.most or state.now - job.submit_time < self.after:
            return None
        total = job.total()
        named = state.quota.named_pools(queue)
        for pool in pools:
            if pool not in named or not state.quota.within_nominal(queue, pool, total):
                continue  # a borrower, whom reclaim may evict at once: hold nothing idle
            check = state.quota.check(queue, pool, job)
            if not check.fits and check.blocking_queue != ROOT:
                continue  # short of quota, not of capacity: nothing to reserve
            reservation = plan_reservation(state, job, pool)
            if reservation is not None:
                return reservation
        return None

    def ripe_at(self, job: PendingJob) -> float | None:
        return job.submit_time + self.after if self.after > 0 else None


# ----------------------------------------------------------------------------- line

_NEVER: frozenset[Outcome] = frozenset()
_QUOTA = frozenset({Outcome.QUOTA})
_WAITING = frozenset({Outcome.QUOTA, Outcome.CAPACITY})


class LineRule(Protocol):
    """Whether a head that waits ends its queue's line for the cycle."""

    def ends(self, queue: Queue) -> frozenset[Outcome]:
        """The outcomes of a try that end ``queue``'s line (the jobs behind that head
        wait behind it, whatever they ask for)."""
        ...


@dataclass(frozen=True, slots=True)
class BestEffortFifo:
    """The jobs behind a waiting head are tried (Kueue's ``BestEffortFIFO``), unless
    the queue says ``queueing: strict``: then a head short of quota ends the line."""

    def ends(self, queue: Queue) -> frozenset[Outcome]:
        return _QUOTA if queue.strict else _NEVER


@dataclass(frozen=True, slots=True)
class StrictFifo:
    """A head that waits, for quota or for capacity, ends its queue's line (Slurm's and
    Helios' FIFO without backfill)."""

    def ends(self, queue: Queue) -> frozenset[Outcome]:
        return _WAITING


@dataclass(frozen=True, slots=True)
class BackfillFifo:
    """A head short of quota ends its queue's line; behind one short of capacity, the
    jobs that do not delay its reservation may start (Slurm's FIFO with backfill)."""

    def ends(self, queue: Queue) -> frozenset[Outcome]:
        return _QUOTA


# ---------------------------------------------------------------------- composition


@dataclass(frozen=True, slots=True)
class Rules:
    """A policy as the cycle uses it: one strategy per concern."""

    order: QueueOrder
    victims: VictimRule
    quota: QuotaRule
    reservations: ReservationRule
    line: LineRule


_VICTIMS: dict[tuple[bool, bool], VictimRule] = {
    (False, False): NoPreemption(),
    (False, True): ReclaimOnly(),
    (True, False): WithinQueueOnly(),
    (True, True): PriorityAndReclaim(),
}
"""By (``preemption``, ``reclaim``); ``protect_covered`` wraps the rule in
:class:`~allotment.scheduler.victims.SparingCovered`."""


def compose(policy: SchedulerPolicy) -> Rules:
    """The strategies ``policy``'s switches stand for (the one place that reads them)."""
    line: LineRule
    if not policy.strict_fifo:
        line = BestEffortFifo()
    elif policy.backfill:
        line = BackfillFifo()
    else:
        line = StrictFifo()
    victims = _VICTIMS[(policy.preemption, policy.reclaim)]
    if policy.protect_covered:
        victims = SparingCovered(victims)
    return Rules(
        order=FairShareOrder(policy.aging_horizon) if policy.fair_share else SubmitOrder(),
        victims=victims,
        quota=BorrowingQuota() if policy.borrowing else IsolatedQuota(),
        reservations=(
            Backfill(policy.max_reservations, policy.reserve_after if policy.reclaim else 0.0)
            if policy.backfill
            else NoReservations()
        ),
        line=line,
    )
