"""Moves: room for a job owed its guarantee, by restarting small jobs on other nodes of
the same pool.

Reclaim gives back what borrowers hold, but not always in one piece: a pool's free GPUs
may be spread over nodes that each keep a few small jobs (its owner's own, or jobs of
queues within their guarantee), so a job that asks for most of a node finds none even
with every borrower gone, and its queue stays short of its guarantee until enough of
those small jobs end on one node. Where the victim rule allows moves
(:meth:`~allotment.scheduler.victims.VictimRule.may_move`: other queues hold part of
the guarantee, or one is about to, :mod:`allotment.scheduler.borrower_turn`), a job
owed its guarantee in a pool whose ordinary victim search failed (or found only a set
that throws a gang back and loses more than twice the work of the moves) may also take,
from the node each of its replicas needs, its own queue's running one-replica jobs of a
priority no higher than its own (cause ``move``), each only if it fits again at once on
another node of the same pool that no replica takes (where borrowers may be reclaimed to
make room for it, or one more level of such moves made: a moved job may take the room
that moving another of the queue's jobs elsewhere leaves), its queue's quota unchanged;
the node's borrowers go as in reclaim, each only while its queue still borrows (else
that queue would be owed in turn). A node may be freed in more than one way (which of
its jobs move, which borrowers go): several are weighed, since the cheapest-looking may
move a job that fits nowhere else. For a gang, a job moved for one replica first goes
where it fits as things are; where that leaves too few nodes for the later replicas,
the plan is made once more with moved jobs kept off every node that reclaim alone would
clear. The moved jobs are requeued like any victim and restart from the beginning (their
progress is lost, as with every preemption), so the nodes whose victims lose the least
work are taken (GPUs times time run); when they come back they are tried first
(:class:`~allotment.scheduler.session.MovedJobs`). KAI-Scheduler's consolidation works
the same way: evict only what can be placed again at once.

Only the owed queue's own jobs move: its small jobs spread over the nodes are what
keeps it from room where it is owed its guarantee (on Philly, all of the moves), while
restarting another queue's job that runs within that queue's guarantee would make a
tenant pay for another's guarantee, and on gang-heavy workloads cost the other jobs
more waiting than it saved (measured in the README, "Moves"). Under the ``protect``
modifier (:class:`~allotment.scheduler.victims.SparingCovered`) any queue's one-replica
jobs move: reclaim there never takes a borrowing queue's covered gang, which would
otherwise have freed whole nodes at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet

from allotment.domain.resources import GPU
from allotment.scheduler.placement import Claims, NodeState, take_devices
from allotment.scheduler.snapshot import ReplicaPlacement
from allotment.scheduler.state import CycleState, Holder
from allotment.scheduler.victims import Candidate, lost_work, may_be_victim, most_valuable_first

PLACED_AFTER_FIRST = 4
"""Once the moves that free some node for the job are known to fit elsewhere, how many
more of the cheaper-looking nodes are checked (that check looks at every node)."""

CHAIN = 1
"""How many levels of moves a move may set off: a job moved to make room may itself need
room that moving another job of the queue makes (on a node of its own), but no further."""

CHAIN_TRIES = 8
"""How many ways of making room by moving further jobs are placed in full at one level
(the cheapest-looking first): each looks at every node of the pool again."""

SETS_PER_NODE = 4
"""How many ways of freeing one node are weighed: the cheapest-looking set may move a
job that fits nowhere else while another set, moving other jobs, would do."""


def plan_moves(
    state: CycleState,
    requests: list[Mapping[str, int]],
    pool: str,
    candidates: list[Candidate],
    movable: Callable[[Holder], bool],
    claims: Claims | None,
    cost: Callable[[list[Candidate]], tuple[tuple[int, float], int]],
    allowed: Callable[[list[Candidate]], bool],
) -> list[Candidate] | None:
    """Victims that leave room in ``pool`` for a job's replicas (``requests``, one node
    each; the largest first): for each, a node where it fits already, else the node
    whose victims cost least (``cost``): ``candidates`` there (borrowers, in their
    order) and running one-replica jobs that ``movable`` allows (cause ``move``, the
    least work lost first), each of which fits at once on another node of the pool that
    no replica takes (:meth:`_View.place_again`); only sets that ``allowed`` accepts (a
    borrower only while its queue still borrows). None when some replica finds no such
    node, or when the job fits as things are. Worked out on copies of the nodes;
    ``state`` unchanged."""
    if not any(r.get(GPU, 0) for r in requests):
        return None  # room without GPUs is not what fragments
    on_node: dict[str, list[Candidate]] = {}
    named = {h.id for h, _ in candidates}
    for holder, cause in candidates:
        for node in {p.node for p in holder.placements}:
            on_node.setdefault(node, []).append((holder, cause))
    for group in state.by_queue.get(pool, {}).values():
        for holder in group.values():
            if (
                len(holder.placements) == 1
                and holder.id not in named
                and may_be_victim(holder)
                and movable(holder)
            ):
                on_node.setdefault(holder.placements[0].node, []).append((holder, "move"))
    now = state.now
    for items in on_node.values():
        # Borrowers first, in their order; then the moves, the least work lost first.
        items.sort(key=lambda c: lost_work(c[0], now) if c[1] == "move" else -1.0)
    nodes = state.placer.by_pool.get(pool, ())
    by_size = sorted(requests, key=lambda r: -r.get(GPU, 0))
    plan = _plan(_View(nodes, claims), by_size, on_node, now, cost, allowed, frozenset())
    if plan is None and len(requests) > 1:
        # A job moved for one replica, placed where it fits, may fill the free room of a
        # node that reclaim alone would clear for a later one: once more, with moved
        # jobs kept off such nodes.
        view = _View(nodes, claims)
        keep = frozenset(
            name
            for name, items in on_node.items()
            if view.free_sets(name, by_size[0], [i for i in items if i[1] != "move"], now)
        )
        if keep:
            plan = _plan(view, by_size, on_node, now, cost, allowed, keep)
    return plan


def _plan(
    view: _View,
    requests: list[Mapping[str, int]],
    on_node: Mapping[str, list[Candidate]],
    now: float,
    cost: Callable[[list[Candidate]], tuple[tuple[int, float], int]],
    allowed: Callable[[list[Candidate]], bool],
    keep: frozenset[str],
) -> list[Candidate] | None:
    """:func:`plan_moves` for ``requests`` in their order, on ``view``; moved jobs go to
    none of the nodes in ``keep``."""
    chosen: list[Candidate] = []
    gone: set[str] = set()
    for request in requests:
        ready = view.fitting(request)
        if ready is not None:
            view.take(ready, request)
            continue
        # Each node's victims first (cheap, on a copy of that node), the cheapest first;
        # then whether the moved jobs fit elsewhere, which costs a look at every node.
        options: list[tuple[tuple[tuple[int, float], int], str, list[Candidate]]] = []
        for name, items in on_node.items():
            if name in view.used:
                continue
            left = [item for item in items if item[0].id not in gone]
            for freed in view.free_sets(name, request, left, now):
                options.append((cost(chosen + freed), name, freed))
        options.sort(key=lambda o: o[0])
        best: tuple[tuple[tuple[int, float], int], list[Candidate], _View] | None = None
        tried = 0
        for floor, name, freed in options:
            if best is not None and (floor >= best[0] or tried > PLACED_AFTER_FIRST):
                break  # no cheaper set is left, or enough have been compared
            if not allowed(chosen + freed):
                continue
            after = view.copy()
            after.release(name, [h for h, _ in freed])
            taken = gone | {h.id for h, _ in freed}
            moved = [h for h, cause in freed if cause == "move"]
            room_made = after.place_again(moved, keep | {name}, on_node, taken, now)
            if best is not None:
                tried += 1
            if room_made is None or not allowed(chosen + freed + room_made):
                continue
            key = cost(chosen + freed + room_made)
            if best is None or key < best[0]:
                after.take(name, request)
                best = (key, freed + room_made, after)
        if best is None:
            return None
        _, freed, view = best
        chosen.extend(freed)
        gone.update(h.id for h, _ in freed)
    return chosen or None


class _View:
    """The pool's nodes as a plan would leave them: copies of those it changed."""

    def __init__(self, nodes: Iterable[NodeState], claims: Claims | None) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.rooms: dict[str, NodeState] = {}
        self.used: set[str] = set()
        """Nodes a replica of the job takes (nothing moves there)."""
        self.claims = claims

    def copy(self) -> _View:
        out = _View((), self.claims)
        out.nodes = self.nodes
        out.rooms = {name: room.twin() for name, room in self.rooms.items()}
        out.used = set(self.used)
        return out

    def take(self, name: str, request: Mapping[str, int]) -> None:
        """A replica asking ``request`` placed on ``name``."""
        self.used.add(name)
        _occupy(self._own(name), request)

    def room(self, name: str) -> NodeState:
        return self.rooms.get(name) or self.nodes[name]

    def _own(self, name: str) -> NodeState:
        room = self.rooms.get(name)
        if room is None:
            room = self.rooms[name] = self.nodes[name].twin()
        return room

    def claim(self, name: str) -> Mapping[str, int] | None:
        return self.claims.get(name) if self.claims else None

    def fitting(self, request: Mapping[str, int]) -> str | None:
        """A node where ``request`` fits as things are."""
        for name in self.nodes:
            if name not in self.used and self.room(name).fits(request, self.claim(name)):
                return name
        return None

    def free_sets(
        self, name: str, request: Mapping[str, int], items: list[Candidate], now: float
    ) -> list[list[Candidate]]:
        if name not in self.nodes:
            return []
        return free_sets(self.room(name), request, items, self.claim(name), now)

    def release(self, name: str, holders: list[Holder]) -> None:
        room = self._own(name)
        for holder in holders:
            give(room, holder, 1)

    def place_again(
        self,
        moved: list[Holder],
        avoid: AbstractSet[str],
        items: Mapping[str, list[Candidate]],
        taken: set[str],
        now: float,
        chain: int = CHAIN,
    ) -> list[Candidate] | None:
        """Place every ``moved`` job, the largest first, on a node not in ``avoid`` that
        no replica takes: the tightest where it fits, else where the ``items`` there
        (none of ``taken``), taken as victims, make room at the least work lost (see
        :meth:`make_room`); those victims, or None when some job fits nowhere."""
        extra: list[Candidate] = []
        for holder in sorted(moved, key=lambda h: -h.total.get(GPU, 0)):
            wanted = holder.placements[0].resources
            target: NodeState | None = None
            for name in self.nodes:
                if name in avoid or name in self.used:
                    continue
                room = self.room(name)
                if room.fits(wanted, self.claim(name)) and (
                    target is None or room.free.get(GPU, 0) < target.free.get(GPU, 0)
                ):
                    target = room
            if target is not None:
                _occupy(self._own(target.name), wanted)
                continue
            out = self.make_room(wanted, avoid, items, taken, now, chain)
            if out is None:
                return None
            taken.update(h.id for h, _ in out)
            extra.extend(out)
        return extra

    def make_room(
        self,
        wanted: Mapping[str, int],
        avoid: AbstractSet[str],
        items: Mapping[str, list[Candidate]],
        taken: set[str],
        now: float,
        chain: int,
    ) -> list[Candidate] | None:
        """Room for a moved job asking ``wanted`` on a node not in ``avoid``, taken (this
        view changed to hold it): the victims there that lose the least work, borrowers
        and, while ``chain`` is above 0, jobs moved in turn (each placed again one level
        down, on another node); None where nothing makes room."""
        options: list[tuple[float, str, list[Candidate]]] = []
        for name, node_items in items.items():
            if name in avoid or name in self.used or name not in self.nodes:
                continue
            left = [
                item
                for item in node_items
                if item[0].id not in taken and (chain > 0 or item[1] != "move")
            ]
            if left:
                for out in free_sets(self.room(name), wanted, left, self.claim(name), now):
                    options.append((sum(lost_work(h, now) for h, _ in out), name, out))
        options.sort(key=lambda o: o[0])
        best: tuple[float, str, list[Candidate], _View | None] | None = None
        tries = 0
        for lost, name, out in options:
            if best is not None and lost >= best[0]:
                break  # the rest lose more, even before any move of theirs is placed
            further = [h for h, cause in out if cause == "move"]
            if not further:
                best = (lost, name, out, None)
                break
            if tries >= CHAIN_TRIES:
                continue
            tries += 1
            trial = self.copy()
            trial.release(name, [h for h, _ in out])
            _occupy(trial._own(name), wanted)
            more = trial.place_again(
                further, avoid | {name}, items, taken | {h.id for h, _ in out}, now, chain - 1
            )
            if more is None:
                continue
            lost += sum(lost_work(h, now) for h, _ in more)
            if best is None or lost < best[0]:
                best = (lost, name, out + more, trial)
        if best is None:
            return None
        _, name, out, made = best
        if made is None:
            self.release(name, [h for h, _ in out])
            _occupy(self._own(name), wanted)
        else:
            self.rooms = made.rooms
        return out


def _occupy(room: NodeState, request: Mapping[str, int]) -> None:
    """Take ``request`` on ``room`` (its devices as the placer would pick them)."""
    devices = tuple(take_devices(list(room.device_free), request.get(GPU, 0)))
    room.apply(
        ReplicaPlacement(
            group="", index=0, node=room.name, resources=dict(request), devices=devices
        ),
        -1,
    )


def free_sets(
    target: NodeState,
    request: Mapping[str, int],
    items: list[Candidate],
    claim: Mapping[str, int] | None,
    now: float,
    most: int = SETS_PER_NODE,
) -> list[list[Candidate]]:
    """Up to ``most`` different sets of ``items`` whose departure from ``target`` leaves
    room for ``request`` (each as :func:`free_one` picks it): the first from all of
    them, then, for each job moved in a set found, one without that job among the
    items (so a set that moves other jobs, or takes more borrowers), breadth first."""
    out: list[list[Candidate]] = []
    seen: set[frozenset[str]] = set()
    tried: set[frozenset[str]] = set()
    waiting: list[frozenset[str]] = [frozenset()]
    while waiting and len(out) < most:
        without = waiting.pop(0)
        found = free_one(target, request, [i for i in items if i[0].id not in without], claim, now)
        if found is None:
            continue
        ids = frozenset(h.id for h, _ in found)
        if ids in seen:
            continue
        seen.add(ids)
        out.append(found)
        for holder, cause in found:
            further = without | {holder.id}
            if cause == "move" and further not in tried:
                tried.add(further)
                waiting.append(further)
    return out


def free_one(
    target: NodeState,
    request: Mapping[str, int],
    items: list[Candidate],
    claim: Mapping[str, int] | None,
    now: float,
) -> list[Candidate] | None:
    """Those of ``items`` whose departure from ``target`` leaves room for ``request``
    beside ``claim``: taken in order until it fits, then every one it can do without
    given back, the most valuable first; None when all of them gone are not enough.
    Worked out on a copy of the node."""
    room = target.twin()
    chosen: list[Candidate] = []
    for item in items:
        give(room, item[0], 1)
        chosen.append(item)
        if room.fits(request, claim):
            break
    else:
        return None
    for item in most_valuable_first(chosen, now):
        give(room, item[0], -1)
        if room.fits(request, claim):
            chosen.remove(item)
        else:
            give(room, item[0], 1)
    return chosen


def give(room: NodeState, holder: Holder, sign: int) -> None:
    """Give back (``sign`` 1) or take again (-1) what ``holder`` holds on ``room``'s node."""
    for placement in holder.placements:
        if placement.node == room.name:
            room.apply(placement, sign)
