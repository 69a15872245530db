"""Victim rules: which running jobs a preemptor may take, in what order, and why.

One concern of the policy seam (:mod:`allotment.scheduler.policy`, whose
:func:`~allotment.scheduler.policy.compose` picks the rule); the search itself is
:mod:`allotment.scheduler.preemption`. A rule is three switches -- whether a queue may take
lower priorities of its own (``preemption.within_queue`` permitting), whether it may
take back what other queues borrow, and whether a job owed its guarantee may move jobs
that fit again elsewhere (:mod:`allotment.scheduler.moves`) -- named by the four
strategies below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from allotment.domain.cluster import PriorityClass, Queue
from allotment.domain.resources import GPU, MILLI

if TYPE_CHECKING:
    from allotment.scheduler.state import CycleState, Holder


class VictimRule(Protocol):
    """Which running jobs may be victims of a preemptor, in the order they are given up,
    and why (the victim's ``cause``)."""

    def may_preempt(self, klass: PriorityClass) -> bool:
        """Whether a job of ``klass`` that fits nowhere is worth a victim search."""
        ...

    def may_reclaim(
        self, state: CycleState, leaf: Queue, pool: str, total: Mapping[str, int]
    ) -> bool:
        """Whether ``leaf`` may take back from other queues' borrowers in ``pool`` to
        fit ``total`` (it stays within its nominal quota)."""
        ...

    def may_move(self, state: CycleState, leaf: Queue, pool: str, lending: bool = False) -> bool:
        """Whether a job of ``leaf`` that may reclaim in ``pool`` (:meth:`may_reclaim`)
        but that no victim set fits may also restart other jobs on other nodes of
        ``pool`` to make room (:mod:`allotment.scheduler.moves`): other queues hold part
        of ``leaf``'s guarantee there, or (``lending``) another queue's job is about to
        take part of it (:mod:`allotment.scheduler.borrower_turn`)."""
        ...

    def moves_any_queue(self) -> bool:
        """Whether moves (:meth:`may_move`) may restart any queue's one-replica jobs, not
        only those of the queue owed its guarantee."""
        ...

    def candidates(
        self,
        state: CycleState,
        leaf: Queue,
        pool: str,
        job_class: PriorityClass,
        reclaim: bool,
        borrowing: Callable[[str], bool],
    ) -> list[Candidate]:
        """The running jobs of ``pool`` that may be victims of a ``job_class`` job of
        ``leaf``, each with its cause (``within_queue``, ``reclaim``, ``borrow_only``),
        in the order they are given up (borrow-only first, then lowest priority, then
        least work lost: :func:`lost_work`); never a job admitted in this cycle, and a borrower
        (``reclaim``) only of a queue that ``borrowing`` says still borrows there."""
        ...


Candidate = tuple["Holder", str]
"""A possible victim and its cause."""


def lost_work(holder: Holder, now: float) -> float:
    """What taking ``holder`` throws away: its GPUs (every replica's, in milli-GPUs) times
    the time it has run; a job without GPUs counts as one GPU."""
    return (holder.total.get(GPU, 0) or MILLI) * max(0.0, now - holder.start_time)


def most_valuable_first(victims: list[Candidate], now: float) -> list[Candidate]:
    """The order victims are given back in when a set is trimmed: the highest priority,
    then the most work that taking it would lose."""
    return sorted(victims, key=lambda c: (-c[0].klass.value, -lost_work(c[0], now)))


def _ordered(found: list[Candidate], now: float) -> list[Candidate]:
    def key(item: Candidate) -> tuple[int, int, float, float]:
        holder = item[0]
        borrow_only = 0 if holder.klass.borrow_only else 1
        return (borrow_only, holder.klass.value, lost_work(holder, now), -holder.start_time)

    found.sort(key=key)
    return found


def may_be_victim(holder: Holder) -> bool:
    """Whether ``holder`` may be taken at all: preemptible, not stopping already, and not
    admitted in this cycle."""
    preemptible = holder.klass.preemptible or holder.preemptible
    return preemptible and not holder.terminating and not holder.fresh


def _own_cause(klass: PriorityClass, below: int, borrow_only: bool) -> str | None:
    """Why a job of the preemptor's own queue, of ``klass``, may be taken: its class is
    ``borrow_only`` (when the preemptor's may take such: ``borrow_only``), or its value is
    under ``below``; None if it may not."""
    if klass.borrow_only and borrow_only:
        return "borrow_only"
    if klass.value < below:
        return "within_queue"
    return None


def _own(state: CycleState, leaf: Queue, pool: str, job_class: PriorityClass) -> list[Candidate]:
    """The queue's own jobs in ``pool`` that ``preemption.within_queue`` gives up: of a
    lower priority (``lower_priority``) or not higher (``any``), and borrow-only ones."""
    mode = leaf.spec.preemption.within_queue
    held = state.classes.get((pool, leaf.name))
    if mode == "never" or not held:
        return []  # nothing of its own may be taken, or it holds nothing there
    below = job_class.value + (mode == "any")  # ``any``: its own class too
    takes = not job_class.borrow_only
    # By class first: most of a queue's jobs are of its own class, which it may not take.
    if all(_own_cause(klass, below, takes) is None for klass, _ in held.values()):
        return []
    out: list[Candidate] = []
    for holder in state.queue_holders(pool, leaf.name).values():
        found = _own_cause(holder.klass, below, takes)
        if found is not None and may_be_victim(holder):
            out.append((holder, found))
    return out


def _others(
    state: CycleState,
    leaf: Queue,
    pool: str,
    job_class: PriorityClass,
    reclaim: bool,
    borrowing: Callable[[str], bool],
) -> list[Candidate]:
    """Other queues' jobs in ``pool`` that may be taken: borrow-only ones unless the
    queue's ``preemption.reclaim`` is ``never``; with ``reclaim``, the jobs of queues
    that still borrow there, as the mode allows (``any``, or ``lower_priority``)."""
    mode = leaf.spec.preemption.reclaim
    if mode == "never":
        return []
    out: list[Candidate] = []
    if reclaim:
        for queue, group in state.by_queue.get(pool, {}).items():
            if queue == leaf.name or not group:
                continue
            takes = borrowing(queue)
            for holder in group.values():
                if not may_be_victim(holder):
                    continue
                klass = holder.klass
                if klass.borrow_only and not job_class.borrow_only:
                    out.append((holder, "borrow_only"))
                elif takes and (mode == "any" or klass.value < job_class.value):
                    out.append((holder, "reclaim"))
        return out
    if job_class.borrow_only:
        return []
    for holder in state.borrow_only.get(pool, {}).values():
        if holder.queue != leaf.name and may_be_victim(holder):
            out.append((holder, "borrow_only"))
    return out


def covered(state: CycleState, queue: str, pool: str, group: Mapping[str, Holder]) -> set[str]:
    """The jobs of ``queue`` in ``pool`` (``group``) that its guarantee covers: its
    earliest submitted ones, in submission order, while together they stay within its
    nominal quota there (borrow-only and terminating jobs aside). What a queue borrows
    is then its latest work: a job that had to borrow only because the queue's younger
    jobs held its guarantee is not the one taken back."""
    nominal = state.quota.nominal(queue, pool)
    out: set[str] = set()
    if not nominal:
        return out
    used: dict[str, int] = {}
    for holder in sorted(group.values(), key=lambda h: (h.submit_time, h.id)):
        if holder.terminating or holder.klass.borrow_only:
            continue
        for resource, amount in holder.total.items():
            if resource in nominal:
                used[resource] = used.get(resource, 0) + amount
        if any(used.get(r, 0) > limit for r, limit in nominal.items()):
            break
        out.add(holder.id)
    return out


@dataclass(frozen=True, slots=True)
class _Victims:
    """A victim rule from its two switches."""

    OWN: ClassVar[bool] = False
    """Lower priorities of the preemptor's own queue (and its ``borrow_only`` jobs)."""
    OTHERS: ClassVar[bool] = False
    """Other queues' borrowers, when the preemptor's queue is within its nominal quota
    (and their ``borrow_only`` jobs)."""
    MOVES: ClassVar[bool] = False
    """Jobs that fit again at once elsewhere in the pool, for a job owed its guarantee
    that no victim set fits (:mod:`allotment.scheduler.moves`)."""

    def may_preempt(self, klass: PriorityClass) -> bool:
        return (self.OWN or self.OTHERS) and klass.can_preempt

    def may_reclaim(
        self, state: CycleState, leaf: Queue, pool: str, total: Mapping[str, int]
    ) -> bool:
        return self.OTHERS and state.quota.within_nominal(leaf.name, pool, total)

    def may_move(self, state: CycleState, leaf: Queue, pool: str, lending: bool = False) -> bool:
        return (
            self.MOVES
            and leaf.spec.preemption.reclaim != "never"
            and (lending or state.quota.lent_out(leaf.name, pool))
        )

    def moves_any_queue(self) -> bool:
        return False

    def candidates(
        self,
        state: CycleState,
        leaf: Queue,
        pool: str,
        job_class: PriorityClass,
        reclaim: bool,
        borrowing: Callable[[str], bool],
    ) -> list[Candidate]:
        found = _own(state, leaf, pool, job_class) if self.OWN else []
        if self.OTHERS:
            found += _others(state, leaf, pool, job_class, reclaim, borrowing)
        return _ordered(found, state.now) if found else found


@dataclass(frozen=True, slots=True)
class NoPreemption(_Victims):
    """Nothing is ever preempted."""


@dataclass(frozen=True, slots=True)
class ReclaimOnly(_Victims):
    """A queue within its nominal quota takes back what other queues borrow (and
    ``borrow_only`` jobs of other queues); never a job of its own queue."""

    OTHERS = True


@dataclass(frozen=True, slots=True)
class WithinQueueOnly(_Victims):
    """Higher priority preempts lower within a queue (as the queue's
    ``preemption.within_queue`` allows); nothing is taken from other queues."""

    OWN = True


@dataclass(frozen=True, slots=True)
class PriorityAndReclaim(_Victims):
    """:class:`WithinQueueOnly` and :class:`ReclaimOnly` together, and moves for a job
    owed its guarantee (what production runs)."""

    OWN = True
    OTHERS = True
    MOVES = True


@dataclass(frozen=True, slots=True)
class SparingCovered:
    """Another rule's victims, less the ones reclaim would take from work that a
    borrowing queue's guarantee covers (:func:`covered`): what a queue borrows is its
    latest work. The ``protect`` modifier of a preset.

    Where the other rule moves jobs, moves may restart any queue's one-replica jobs: a
    borrowing queue's covered gang no longer gives an owner its whole nodes, and moving
    the small jobs that keep other nodes from being whole is then the one way left to
    honour the owner's guarantee."""

    inner: VictimRule

    def may_preempt(self, klass: PriorityClass) -> bool:
        return self.inner.may_preempt(klass)

    def may_reclaim(
        self, state: CycleState, leaf: Queue, pool: str, total: Mapping[str, int]
    ) -> bool:
        return self.inner.may_reclaim(state, leaf, pool, total)

    def may_move(self, state: CycleState, leaf: Queue, pool: str, lending: bool = False) -> bool:
        return self.inner.may_move(state, leaf, pool, lending)

    def moves_any_queue(self) -> bool:
        return True

    def candidates(
        self,
        state: CycleState,
        leaf: Queue,
        pool: str,
        job_class: PriorityClass,
        reclaim: bool,
        borrowing: Callable[[str], bool],
    ) -> list[Candidate]:
        found = self.inner.candidates(state, leaf, pool, job_class, reclaim, borrowing)
        queues = {holder.queue for holder, cause in found if cause == "reclaim"}
        if not queues:
            return found
        groups = state.by_queue.get(pool, {})
        kept: set[str] = set()
        for queue in queues:
            kept |= covered(state, queue, pool, groups.get(queue, {}))
        return [item for item in found if item[1] != "reclaim" or item[0].id not in kept]
