"""Victim search: the smallest set of running jobs whose removal lets a job in.

Candidates, in the order they are given up: ``borrow_only`` jobs first, then the lowest
priority, then the least work lost (GPUs times time run: a gang that has run an hour
loses far more than a 1-GPU job that has run two). A job may take:

* within its own queue, jobs of lower priority when the queue's
  ``preemption.within_queue`` is ``lower_priority`` (``any``: equal priority too);
* from other queues, jobs of queues that are *borrowing* in that pool, when its own
  queue stays within its nominal quota and ``preemption.reclaim`` allows (``any`` or
  ``lower_priority``);
* ``borrow_only`` jobs of any queue, unless its queue says ``reclaim: never``.

Never a job of a non-preemptible class (unless its spec says ``preemptible: true``), one
already terminating, or one already chosen.
Which of these the policy allows -- none, reclaim only, or priority within a queue and
reclaim -- and the candidates' order are its victim rule's
(:class:`~allotment.scheduler.victims.VictimRule`); this module is the search. It removes
candidates one by one (undoable what-ifs) until the job fits in quota and on nodes, then
gives back every victim it can do without, and verifies. A gang is also tried node by
node: the nodes that its victims could free for one of its replicas, least work lost
first, each node's victims together (one by one, a gang's victims may be spread over
many nodes, and a borrower's queue be back within its guarantee before any node is
whole again); of the two sets, it takes the one that loses less work. A one-replica job
compares the nodes that could be freed for it (:func:`_on_one_node`). Where all of this
fails for a job owed its guarantee and the rule allows moves, its own queue's jobs that
fit again at once elsewhere in the pool may be taken too, any queue's where the rule says
so (:mod:`allotment.scheduler.moves`). Where it succeeds only by throwing a gang back
(a borrower's, say, that has run for hours: every replica restarts from scratch), the
moves are weighed against that set too, and taken where they lose less than half its
work (:data:`MOVES_MARGIN`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from allotment.domain.cluster import PriorityClass, Queue
from allotment.domain.reasons import Reason, ReasonCode
from allotment.domain.resources import GPU, MILLI
from allotment.scheduler.backfill import Reservation
from allotment.scheduler.decisions import Victim
from allotment.scheduler.moves import free_one, plan_moves
from allotment.scheduler.placement import Claims, PlacementResult, per_node
from allotment.scheduler.snapshot import PendingJob
from allotment.scheduler.state import CycleState, Holder
from allotment.scheduler.victims import lost_work, most_valuable_first

MAX_CANDIDATES = 512
"""Bound on the candidates examined for one preemptor (keeps a cycle fast)."""
NODES_AFTER_FIRST_FIT = 32
"""Once some node can be freed for a one-replica job, how many more are compared."""
MOVES_MARGIN = 2.0
"""Moves replace a victim set that throws a gang back only where they lose this many
times less work: sparing a borrower's gang leaves its queue borrowing, so the next queue
owed its guarantee may take it back all the same, and every move restarts a job. With
no margin, the 3-day synthetic traces waited longer than without such moves; with
this one about half as much, and the two-week ones as much less (the README's "What
changed `default`")."""


@dataclass(slots=True)
class VictimPlan:
    victims: list[tuple[Holder, str]]
    placement: PlacementResult


@dataclass(slots=True)
class Candidates:
    """The running jobs of a pool that a preemptor may take, in the order they are given
    up, each with its cause; whether a borrower's queue still borrows there; and which
    jobs it may move elsewhere in the pool (None: no moves)."""

    items: list[tuple[Holder, str]]
    still_borrowing: Callable[[str], bool]
    movable: Callable[[Holder], bool] | None = None
    releasing: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per queue, what its jobs in the pool already give back (terminating, or victims
    chosen earlier in this cycle)."""


def find_victims(
    state: CycleState,
    job: PendingJob,
    leaf: Queue,
    pool: str,
    job_class: PriorityClass,
    taken: set[str],
    claims: Claims | None = None,
    lending: bool = False,
) -> VictimPlan | None:
    """Victims that let ``job`` into ``pool`` (leaving ``claims`` free), with its
    placement once they are gone; None when no allowed, non-empty set suffices
    (``lending``: as :func:`victim_candidates`). Leaves ``state`` as it found it."""
    found = victim_candidates(state, job, leaf, pool, job_class, taken, lending)
    return None if found is None else plan_victims(state, job, leaf, pool, found, claims)


def victim_candidates(
    state: CycleState,
    job: PendingJob,
    leaf: Queue,
    pool: str,
    job_class: PriorityClass,
    taken: set[str],
    lending: bool = False,
) -> Candidates | None:
    """What a ``job_class`` job of ``leaf`` may take in ``pool`` (none of ``taken``);
    None when nothing: a search there fails until a job there becomes a possible victim
    or one of ``leaf``'s ends there (``CycleState.joined``, ``CycleState.left``).
    ``lending``: another queue's job is about to take part of ``leaf``'s guarantee
    there (moves are allowed as if it had)."""
    if not job_class.can_preempt or job_class.borrow_only:
        return None
    total = job.total()
    rule = state.rules.victims
    reclaim_ok = rule.may_reclaim(state, leaf, pool, total)
    releasing = _releasing(state, pool, taken) if reclaim_ok else {}

    def still_borrowing(queue: str) -> bool:
        # A queue whose borrowing its jobs on their way out already give back is owed
        # nothing more: taking another of its jobs would push it below its guarantee,
        # and it would reclaim in turn (preemption ping-pong).
        return state.quota.is_borrowing(queue, pool, releasing=releasing.get(queue))

    candidates = [
        item
        for item in rule.candidates(state, leaf, pool, job_class, reclaim_ok, still_borrowing)
        if item[0].id not in taken
    ][:MAX_CANDIDATES]
    movable: Callable[[Holder], bool] | None = None
    if reclaim_ok and rule.may_move(state, leaf, pool, lending):
        value = job_class.value
        # Only the queue's own jobs are moved, unless the rule says any (moves.py).
        own = None if rule.moves_any_queue() else leaf.name

        def movable(holder: Holder) -> bool:
            # No higher a priority than the job's, nothing chosen already this cycle.
            klass = holder.klass
            return (
                klass.value <= value
                and not klass.borrow_only
                and holder.id not in taken
                and (own is None or holder.queue == own)
            )

    if not candidates and movable is None:
        return None
    return Candidates(candidates, still_borrowing, movable, releasing)


def plan_victims(
    state: CycleState,
    job: PendingJob,
    leaf: Queue,
    pool: str,
    found: Candidates,
    claims: Claims | None = None,
) -> VictimPlan | None:
    """The smallest set of ``found`` whose removal lets ``job`` into ``pool`` (leaving
    ``claims`` free), with its placement once they are gone; None when none suffices.
    Leaves ``state`` as it found it."""
    candidates, still_borrowing = found.items, found.still_borrowing
    total = job.total()
    # Cheap bound first: even all candidates together plus the free capacity are short.
    gpu = total.get(GPU, 0)
    if gpu and gpu % MILLI == 0:
        held_gpu = sum(h.total.get(GPU, 0) for h, _ in candidates)
        if state.placer.free_gpus(pool) + held_gpu < gpu:
            return None

    whole_gpus = gpu if gpu % MILLI == 0 else 0

    def fits() -> PlacementResult | None:
        if whole_gpus and state.placer.free_gpus(pool) < whole_gpus:
            return None  # not enough free GPUs yet, wherever they are
        if not state.quota.check(leaf.name, pool, job).fits:
            return None
        placed = state.placer.place(
            pool, job.replicas, claims=claims, side=state.side(leaf.name, pool)
        )
        return placed if placed.ok else None

    if job.replica_count == 1:
        request = job.replicas[0].resources
        plan, some_node = _on_one_node(state, request, pool, candidates, claims, fits)
        if plan is None and some_node:  # a node could be freed but the quota said no
            plan = _take(state, [(None, 0, [item]) for item in candidates], still_borrowing, fits)
    else:
        plan = _take(state, [(None, 0, [item]) for item in candidates], still_borrowing, fits)
        need = min(r.resources.get(GPU, 0) for r in job.replicas) if job.replica_count else 0
        if need:
            # Node by node as well, and the set that loses less is taken: one by one,
            # the cheapest victims may free whole nodes that cost more than a borrower's
            # gang that a node-by-node search would take alone.
            whole = _take(state, _node_groups(state, candidates, need), still_borrowing, fits)
            if whole is not None and (
                plan is None or _cost(whole.victims, state.now) < _cost(plan.victims, state.now)
            ):
                plan = whole
    if found.movable is not None and (plan is None or _restarts_a_gang(plan)):
        moved = _moved(state, job, pool, found, claims, fits)
        if moved is not None and (plan is None or _clearly_cheaper(moved, plan, state.now)):
            plan = moved
    return plan


def _restarts_a_gang(plan: VictimPlan) -> bool:
    """Whether ``plan`` throws a gang back: every replica restarts from scratch."""
    return any(len(holder.placements) > 1 for holder, _ in plan.victims)


def _clearly_cheaper(moved: VictimPlan, plan: VictimPlan, now: float) -> bool:
    """Whether moves lose :data:`MOVES_MARGIN` times less work than ``plan`` (of no
    higher a priority)."""
    top, lost = _cost(moved.victims, now)
    return (top, MOVES_MARGIN * lost) < _cost(plan.victims, now)


def _moved(
    state: CycleState,
    job: PendingJob,
    pool: str,
    found: Candidates,
    claims: Claims | None,
    fits: Callable[[], PlacementResult | None],
) -> VictimPlan | None:
    """Room for ``job`` by moving jobs that fit again elsewhere in the pool
    (:mod:`allotment.scheduler.moves`), verified with those victims gone; not when a
    borrower it takes would no longer be borrowing."""
    assert found.movable is not None
    allowed = _keeps_borrowing(state, pool, found.releasing)
    chosen = plan_moves(
        state,
        [r.resources for r in job.replicas for _ in range(r.count)],
        pool,
        found.items,
        found.movable,
        claims,
        lambda victims: (_cost(victims, state.now), len(victims)),
        allowed,
    )
    return None if chosen is None else _verified(state, chosen, fits, allowed)


def _verified(
    state: CycleState,
    victims: list[tuple[Holder, str]],
    fits: Callable[[], PlacementResult | None],
    allowed: Callable[[list[tuple[Holder, str]]], bool] | None = None,
) -> VictimPlan | None:
    """``victims`` with the job's placement once they are gone (quota and nodes
    checked), or None when it still does not fit or ``allowed`` refuses them. Leaves
    ``state`` as it found it."""
    if allowed is not None and not allowed(victims):
        return None
    for holder, _ in victims:
        state.unhold(holder)
    try:
        placed = fits()
        return VictimPlan(victims=victims, placement=placed) if placed is not None else None
    finally:
        for holder, _ in victims:
            state.hold(holder)


def _keeps_borrowing(
    state: CycleState, pool: str, releasing: Mapping[str, Mapping[str, int]]
) -> Callable[[list[tuple[Holder, str]]], bool]:
    """Whether victims may be taken together, in their order: a borrower (``reclaim``)
    only while its queue, without the victims before it and what its jobs already give
    back (``releasing``), still borrows in ``pool``; else that queue would be owed in
    turn. Reads the quota only (the state is not touched)."""

    def allowed(victims: list[tuple[Holder, str]]) -> bool:
        leaving: dict[str, dict[str, int]] = {}
        for holder, cause in victims:
            gone = leaving.get(holder.queue)
            if gone is None:
                gone = leaving[holder.queue] = dict(releasing.get(holder.queue, {}))
            if cause == "reclaim" and not state.quota.is_borrowing(
                holder.queue, pool, releasing=gone
            ):
                return False
            for resource, amount in holder.total.items():
                gone[resource] = gone.get(resource, 0) + amount
        return True

    return allowed


def _cost(victims: list[tuple[Holder, str]], now: float) -> tuple[int, float]:
    """What taking ``victims`` costs: the highest priority among them, then the work
    they lose together."""
    top = max((h.klass.value for h, _ in victims), default=0)
    return top, sum(lost_work(h, now) for h, _ in victims)


Group = tuple[str | None, int, list[tuple[Holder, str]]]
"""Victims taken together: those of one node (named) that must leave the milli-GPUs
given free there, or one victim (no node, 0)."""


def _take(
    state: CycleState,
    groups: list[Group],
    still_borrowing: Callable[[str], bool],
    fits: Callable[[], PlacementResult | None],
) -> VictimPlan | None:
    """Remove ``groups`` in order until the job fits, then give back every victim it can
    do without (most valuable first), and verify. A node's group is kept only if it leaves
    the GPUs it names free there, else it is given back at once; a borrower is skipped
    once its queue is back within its guarantee. Leaves ``state`` as it found it."""
    removed: list[tuple[Holder, str]] = []
    gone: set[str] = set()
    placement: PlacementResult | None = None
    try:
        for node, need, group in groups:
            took: list[tuple[Holder, str]] = []
            for holder, cause in group:
                if holder.id in gone or (cause == "reclaim" and not still_borrowing(holder.queue)):
                    continue  # taken with another node, or its queue is within its guarantee
                state.unhold(holder)
                gone.add(holder.id)
                took.append((holder, cause))
            if not took:
                continue
            if node is not None and state.placer.nodes[node].free.get(GPU, 0) < need:
                for holder, _ in reversed(took):
                    state.hold(holder)
                    gone.discard(holder.id)
                continue  # this node cannot be freed enough: keep its jobs
            removed.extend(took)
            placement = fits()
            if placement is not None:
                break
        if placement is None:
            return None
        # Give back every victim the job can do without, most valuable first.
        for item in most_valuable_first(removed, state.now):
            state.hold(item[0])
            again = fits()
            if again is None:
                state.unhold(item[0])
            else:
                removed.remove(item)
                placement = again
        final = fits()
        if final is None or not removed:
            return None  # nothing to preempt: it is not short of what victims hold
        return VictimPlan(victims=removed, placement=final)
    finally:
        for holder, _ in removed:
            state.hold(holder)


def _node_groups(state: CycleState, candidates: list[tuple[Holder, str]], need: int) -> list[Group]:
    """The candidates node by node, for a gang whose smallest replica asks ``need``
    milli-GPUs: only the nodes that have less free but would have enough with every
    candidate there gone; those giving up the lowest priority first, then those whose
    candidates lose the least work (GPUs times time run, a gang's GPUs on every node it
    spans counted); a node's candidates in their given order."""
    by_node: dict[str, list[tuple[Holder, str]]] = {}
    for item in candidates:
        for node in dict.fromkeys(p.node for p in item[0].placements):
            by_node.setdefault(node, []).append(item)
    ranked: list[tuple[tuple[int, float], str, list[tuple[Holder, str]]]] = []
    for node, items in by_node.items():
        target = state.placer.nodes.get(node)
        if target is None:
            continue
        free = target.free.get(GPU, 0)
        held = sum(
            p.resources.get(GPU, 0) for h, _ in items for p in h.placements if p.node == node
        )
        if free < need <= free + held:
            ranked.append((_cost(items, state.now), node, items))
    ranked.sort(key=lambda r: r[0])
    return [(node, need, items) for _, node, items in ranked]


def _releasing(state: CycleState, pool: str, taken: set[str]) -> dict[str, dict[str, int]]:
    """Per queue, what its jobs in ``pool`` that are already on their way out hold:
    terminating ones, and victims chosen earlier in this cycle."""
    out: dict[str, dict[str, int]] = {}
    leaving = list(state.terminating.values())
    leaving.extend(state.holders[i] for i in taken if i in state.holders)
    seen: set[str] = set()
    for holder in leaving:
        if holder.pool != pool or holder.id in seen:
            continue
        seen.add(holder.id)
        amounts = out.setdefault(holder.queue, {})
        for resource, amount in holder.total.items():
            amounts[resource] = amounts.get(resource, 0) + amount
    return out


def _on_one_node(
    state: CycleState,
    request: Mapping[str, int],
    pool: str,
    candidates: list[tuple[Holder, str]],
    claims: Claims | None,
    fits: Callable[[], PlacementResult | None],
) -> tuple[VictimPlan | None, bool]:
    """For a one-replica job: the node whose cheapest victim set frees room for it
    (lowest highest priority, as Kubernetes' preemption does, then least work lost,
    then fewest victims);
    worked out on copies of each node, then the quota and placement are verified with
    those victims gone. Also says whether any node could be freed at all (when one could
    but the quota still says no, victims elsewhere may be needed)."""
    by_node: dict[str, list[tuple[Holder, str]]] = {}
    for item in candidates:
        for node in {p.node for p in item[0].placements}:
            by_node.setdefault(node, []).append(item)
    best: list[tuple[Holder, str]] | None = None
    best_key: tuple[tuple[int, float], int] | None = None
    looked_after = 0
    need = request.get(GPU, 0)
    for node, items in by_node.items():
        target = state.placer.nodes.get(node)
        if target is None:
            continue
        if (
            need
            and target.free.get(GPU, 0)
            + sum(p.resources.get(GPU, 0) for h, _ in items for p in h.placements if p.node == node)
            < need
        ):
            continue  # even every candidate here gone leaves too few GPUs
        claim = claims.get(node) if claims else None
        chosen = free_one(target, request, items, claim, state.now)
        if chosen:
            cost = (_cost(chosen, state.now), len(chosen))
            if best_key is None or cost < best_key:
                best, best_key = chosen, cost
        if best is not None:
            looked_after += 1
            if looked_after > NODES_AFTER_FIRST_FIT:
                break  # a good set found; the fleet need not be combed for the best
    if best is None:
        return None, False
    return _verified(state, best, fits), True


def describe(
    holder: Holder, cause: str, job: PendingJob, job_class: PriorityClass, pool: str
) -> Victim:
    """The victim record, with a cause its owner can read."""
    if cause == "within_queue":
        text = (
            f"preempted for {job.id} in queue {holder.queue}: priority "
            f"{job_class.name} ({job_class.value}) over {holder.klass.name} "
            f"({holder.klass.value})"
        )
    elif cause == "move":
        text = (
            f"moved for {job.id} (queue {job.queue}): restarted on another node of pool "
            f"{pool}, where it fits now, so that a node holds {job.id}, whose queue is owed "
            "its guaranteed quota"
        )
    elif cause == "borrow_only":
        text = (
            f"preempted for {job.id} (queue {job.queue}): {holder.klass.name} jobs run "
            f"only on idle capacity of pool {pool}, which is needed back"
        )
    else:
        text = (
            f"reclaimed for {job.id}: queue {holder.queue} was borrowing in pool {pool} "
            f"and queue {job.queue} needs its guaranteed quota back"
        )
    return Victim(job=holder.id, queue=holder.queue, cause=cause, message=text)


def held_for_preemptor(
    job: str, pool: str, now: float, placed: PlacementResult, victims: list[Holder]
) -> Reservation:
    """What a preemptor holds against everyone else until its victims are gone: the part
    of its placement that is free now (the rest is the victims', held until they go)."""
    releasing = per_node(p for holder in victims for p in holder.placements)
    claims = per_node(placed.placements)
    for node, claim in claims.items():
        freed = releasing.get(node, {})
        for key in list(claim):
            claim[key] = max(0, claim[key] - freed.get(key, 0))
    return Reservation(job=job, pool=pool, start=now, claims=claims)


def preemptor_claim(job: PendingJob, queue: str, plan: VictimPlan) -> dict[str, int]:
    """What ``job`` of ``queue``, preempting by ``plan``, adds to its queue's guaranteed
    usage once it starts: its request, less what the queue's own victims give up for
    good (a moved job comes back)."""
    claim = dict(job.total())
    for holder, cause in plan.victims:
        if holder.queue == queue and cause != "move" and not holder.klass.borrow_only:
            for resource, amount in holder.total.items():
                claim[resource] = claim.get(resource, 0) - amount
    return claim


def waiting_for(victims: list[str], pool: str, causes: list[str] | None = None) -> Reason:
    """A preemptor's reason while its victims stop: preempting them now (``causes``
    given), or still waiting for those of an earlier cycle."""
    names = ", ".join(victims)
    if causes is not None:
        return Reason(
            ReasonCode.WAITING_FOR_PREEMPTION,
            f"preempting {names} in pool {pool}; their resources are held for this job",
            {"pool": pool, "victims": victims, "causes": causes},
        )
    return Reason(
        ReasonCode.WAITING_FOR_PREEMPTION,
        f"waiting for {names} to stop; their resources in pool {pool} are held for this job",
        {"pool": pool, "victims": victims},
    )
