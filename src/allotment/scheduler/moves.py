"""Moves: room for a job owed its guarantee, by restarting small jobs on other nodes of
the same pool.

Reclaim gives back what borrowers hold, but not always in one piece: a pool's free GPUs
may be spread over nodes that each keep a few small jobs (its owner's own, or jobs of
queues within their guarantee), so a job that asks for most of a node finds none even
with every borrower gone, and its queue stays short of its guarantee until enough of
those small jobs end on one node. Where the victim rule allows moves
(:meth:`~allotment.scheduler.victims.VictimRule.may_move`: other queues hold part of
the guarantee, or one is about to, :mod:`allotment.scheduler.borrower_turn`), a job
owed its guarantee in a pool whose ordinary victim search failed may also take, from
the node each of its replicas needs, its own queue's running one-replica jobs of a
priority no higher than its own (cause ``move``), each only if it fits again at once on
another node of the same pool that no replica takes (where borrowers may be reclaimed to
make room for it), its queue's quota unchanged; the node's borrowers go as in reclaim,
each only while its queue still borrows (else that queue would be owed in turn). The moved jobs
are requeued like any victim and restart from the beginning (their progress is lost, as
with every preemption), so the nodes whose victims lose the least work are taken (GPUs
times time run); when they come back they are tried first
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

from allotment.domain.resources import GPU
from allotment.scheduler.placement import Claims, NodeState, take_devices
from allotment.scheduler.snapshot import ReplicaPlacement
from allotment.scheduler.state import CycleState, Holder
from allotment.scheduler.victims import Candidate, lost_work, may_be_victim, most_valuable_first

PLACED_AFTER_FIRST = 4
"""Once the moves that free some node for the job are known to fit elsewhere, how many
more of the cheaper-looking nodes are checked (that check looks at every node)."""


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
    no replica takes; only sets that ``allowed`` accepts (a borrower only while its
    queue still borrows). None when some replica finds no such node, or when the job
    fits as things are. Worked out on copies of the nodes; ``state`` unchanged."""
    if not any(r.get(GPU, 0) for r in requests):
        return None  # room without GPUs is not what fragments
    view = _View(state.placer.by_pool.get(pool, ()), claims)
    on_node: dict[str, list[Candidate]] = {}
    named = {h.id for h, _ in candidates}
    for holder, cause in candidates:
        for node in {p.node for p in holder.placements}:
            on_node.setdefault(node, []).append((holder, cause))
    # Per node, the candidates there: room a moved job may take.
    borrowers = {node: list(items) for node, items in on_node.items()}
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
    chosen: list[Candidate] = []
    gone: set[str] = set()
    for request in sorted(requests, key=lambda r: -r.get(GPU, 0)):
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
            freed = view.free_one(name, request, left, now)
            if freed is not None:
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
            room_made = after.place_again(moved, name, borrowers, taken, now)
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

    def free_one(
        self, name: str, request: Mapping[str, int], items: list[Candidate], now: float
    ) -> list[Candidate] | None:
        if name not in self.nodes:
            return None
        return free_one(self.room(name), request, items, self.claim(name), now)

    def release(self, name: str, holders: list[Holder]) -> None:
        room = self._own(name)
        for holder in holders:
            give(room, holder, 1)

    def place_again(
        self,
        moved: list[Holder],
        freed: str,
        borrowers: Mapping[str, list[Candidate]],
        taken: set[str],
        now: float,
    ) -> list[Candidate] | None:
        """Place every ``moved`` job, the largest first, on another node than ``freed``:
        the tightest where it fits, else where the fewest of the ``borrowers`` there
        (none of ``taken``), taken as victims, make room; those victims, or None when
        some job fits nowhere."""
        extra: list[Candidate] = []
        for holder in sorted(moved, key=lambda h: -h.total.get(GPU, 0)):
            wanted = holder.placements[0].resources
            target: NodeState | None = None
            for name in self.nodes:
                if name == freed or name in self.used:
                    continue
                room = self.room(name)
                if room.fits(wanted, self.claim(name)) and (
                    target is None or room.free.get(GPU, 0) < target.free.get(GPU, 0)
                ):
                    target = room
            if target is None:
                cheapest: tuple[float, str, list[Candidate]] | None = None
                for name, items in borrowers.items():
                    if name == freed or name in self.used or name not in self.nodes:
                        continue
                    left = [item for item in items if item[0].id not in taken]
                    out = (
                        free_one(self.room(name), wanted, left, self.claim(name), now)
                        if left
                        else None
                    )
                    if out:
                        lost = sum(lost_work(h, now) for h, _ in out)
                        if cheapest is None or lost < cheapest[0]:
                            cheapest = (lost, name, out)
                if cheapest is None:
                    return None
                _, name, out = cheapest
                self.release(name, [h for h, _ in out])
                taken.update(h.id for h, _ in out)
                extra.extend(out)
                target = self.room(name)
            _occupy(self._own(target.name), wanted)
        return extra


def _occupy(room: NodeState, request: Mapping[str, int]) -> None:
    """Take ``request`` on ``room`` (its devices as the placer would pick them)."""
    devices = tuple(take_devices(list(room.device_free), request.get(GPU, 0)))
    room.apply(
        ReplicaPlacement(
            group="", index=0, node=room.name, resources=dict(request), devices=devices
        ),
        -1,
    )


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
