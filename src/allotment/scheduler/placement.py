"""Placement: which nodes and devices a job's replicas get.

All replicas of a job are placed in one pool, all or none (gang). Whole-GPU replicas
take fully free devices and go to the node with the fewest free GPUs that still fits
(best fit); CPU, memory and every other resource must fit too. Multi-replica jobs
prefer one node, then one rack (or ``block``), then anywhere in the pool, choosing the
tightest group. A fractional GPU request (under one GPU) shares a device, best fit.

Borrowers and owners are kept apart: a job of a queue with no guaranteed GPUs in the
pool (a *guest*, whose jobs reclaim will evict) prefers nodes without the pool's own
jobs, and an owner's job nodes without guests, even over a tighter fit; so evicting
guests frees whole nodes, and a gang of the pool's owner can get its guarantee back.

The index keeps, per pool, nodes bucketed by their number of fully free devices, so a
fit is found without scanning the fleet, and the topology groups of each pool. Placement
only reads; :meth:`Placer.allocate` and :meth:`Placer.release` change free capacity and
are exact inverses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allotment.domain.cluster import Node
from allotment.domain.reasons import Reason, ReasonCode
from allotment.domain.resources import CPU, GPU, GPU_MEMORY, MILLI, format_quantity
from allotment.scheduler.snapshot import ReplicaPlacement, ReplicaRequest

TOPOLOGY_LEVELS = ("rack", "block")
"""Topology labels tried, in order, for compact placement of multi-replica jobs."""

Claims = Mapping[str, Mapping[str, int]]
"""Per node, capacity held back for reservations."""

Replica = tuple[str, int, Mapping[str, int]]
"""(group, index, resources) of one replica."""

OWNER, GUEST = 0, 1
"""The side of a job in a pool: its queue is guaranteed GPUs there (owner) or not."""


class NodeState:
    """One schedulable node's free capacity, per-device free milli-GPU included."""

    __slots__ = (
        "capacity",
        "device_free",
        "device_memory",
        "free",
        "held",
        "name",
        "pool",
        "topology",
        "whole_free",
    )
    name: str
    pool: str
    capacity: dict[str, int]
    free: dict[str, int]
    topology: dict[str, str]
    device_free: list[int]
    whole_free: int
    device_memory: int | None
    held: list[int]

    def __init__(self, node: Node | NodeState) -> None:
        """The node's state with nothing held, or (given a state) a copy of that state
        whose free capacity can change independently."""
        if isinstance(node, NodeState):
            self.name, self.pool, self.capacity = node.name, node.pool, node.capacity
            self.topology, self.whole_free = node.topology, node.whole_free
            self.device_memory = node.device_memory
            self.free = dict(node.free)
            self.device_free = list(node.device_free)
            self.held = list(node.held)
            return
        self.name = node.name
        self.pool = node.pool
        self.capacity = node.capacity.as_dict()
        self.free = dict(self.capacity)
        self.topology = dict(node.topology)
        count = self.capacity.get(GPU, 0) // MILLI
        self.device_free = [MILLI] * count
        self.whole_free = count
        memory = self.capacity.get(GPU_MEMORY)
        self.device_memory = memory // count if memory and count else None
        """GPU memory of one device (the node's ``gpu_memory`` over its devices)."""
        self.held = [0, 0]
        """Milli-GPUs held here by owners' jobs and by guests' jobs (:data:`OWNER`,
        :data:`GUEST`)."""

    def twin(self) -> NodeState:
        """A copy whose free capacity can change independently."""
        return NodeState(self)

    def mixes(self, side: int | None) -> bool:
        """Whether a job of ``side`` here would share the node with the other side."""
        return side is not None and self.held[1 - side] > 0

    def fits(self, request: Mapping[str, int], claim: Mapping[str, int] | None = None) -> bool:
        return self.suits(request) and fits_in(
            self.free, self.device_free, request, claim, self.whole_free
        )

    def suits(self, request: Mapping[str, int]) -> bool:
        """Whether the node's devices are large enough for ``request`` at all: its
        ``gpu_memory`` must fit on the devices it gets (one device for a share of one),
        not merely in the node's total."""
        wanted = request.get(GPU_MEMORY)
        if not wanted or self.device_memory is None:
            return True
        return wanted <= self.device_memory * max(1, request.get(GPU, 0) // MILLI)

    def apply(self, placement: ReplicaPlacement, sign: int) -> None:
        """Take (``sign`` -1) or give back (+1) what one replica holds here."""
        free = self.free
        for key, amount in placement.resources.items():
            free[key] = free.get(key, 0) + sign * amount
        gpu = placement.resources.get(GPU, 0)
        if gpu and placement.devices:
            change = sign * (MILLI if gpu >= MILLI else gpu)
            devices = self.device_free
            for index in placement.devices:
                if index < len(devices):
                    before = devices[index]
                    after = devices[index] = before + change
                    self.whole_free += (after == MILLI) - (before == MILLI)


@dataclass(slots=True, init=False)
class PlacementResult:
    """A placement (``placements`` set) or why none (``reason``)."""

    placements: tuple[ReplicaPlacement, ...]
    reason: Reason | None
    nodes: tuple[str, ...]

    # Written out: compiled, it runs natively (a generated one stays interpreted).
    def __init__(
        self,
        placements: tuple[ReplicaPlacement, ...] = (),
        reason: Reason | None = None,
        nodes: tuple[str, ...] = (),
    ) -> None:
        self.placements, self.reason, self.nodes = placements, reason, nodes

    @property
    def ok(self) -> bool:
        return self.reason is None


class Placer:
    """Free capacity of every healthy node, indexed per pool for fast best fit."""

    def __init__(self, nodes: Iterable[Node] | Iterable[NodeState]) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.by_pool: dict[str, list[NodeState]] = {}
        self._buckets: dict[str, list[dict[str, NodeState]]] = {}
        self._groups: dict[str, list[dict[str, list[NodeState]]]] = {}
        self._whole_free: dict[str, int] = {}
        self._version: dict[str, int] = {}
        """Per pool, how many times its free capacity changed (for the caches below)."""
        self._no_fits: dict[tuple[object, ...], tuple[int, Reason]] = {}
        """Per pool and request, the last no-fit reason and the pool's version then: a
        full pool is asked the same many times before anything in it changes."""
        for node in nodes:
            if isinstance(node, NodeState):
                state = node
            elif node.healthy:
                state = NodeState(node)
            else:
                continue
            self.nodes[state.name] = state
            self.by_pool.setdefault(state.pool, []).append(state)
        for pool, states in self.by_pool.items():
            top = max((len(s.device_free) for s in states), default=0)
            buckets: list[dict[str, NodeState]] = [{} for _ in range(top + 1)]
            for state in states:
                buckets[state.whole_free][state.name] = state
            self._buckets[pool] = buckets
            self._whole_free[pool] = sum(state.whole_free for state in states)
            levels = []
            for level in TOPOLOGY_LEVELS:
                groups: dict[str, list[NodeState]] = {}
                for state in states:
                    label = state.topology.get(level)
                    if label is not None:
                        groups.setdefault(label, []).append(state)
                if groups and not (
                    len(groups) == 1 and len(states) == len(next(iter(groups.values())))
                ):
                    levels.append(groups)  # a level that splits the pool
            self._groups[pool] = levels

    def empty(self, pool: str) -> Placer:
        """A separate placer over empty copies of one pool's nodes."""
        copies = []
        for state in self.by_pool.get(pool, ()):
            copy = state.twin()
            copy.free = dict(copy.capacity)
            copy.device_free = [MILLI] * len(copy.device_free)
            copy.whole_free = len(copy.device_free)
            copy.held = [0, 0]
            copies.append(copy)
        return Placer(copies)

    def scratch(self, pool: str) -> Placer:
        """A separate placer over copies of one pool's nodes, for look-ahead."""
        return Placer([s.twin() for s in self.by_pool.get(pool, ())])

    # ---------------------------------------------------------------- capacity

    def pool_capacity(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for pool, states in self.by_pool.items():
            total: dict[str, int] = {}
            for state in states:
                for key, amount in state.capacity.items():
                    total[key] = total.get(key, 0) + amount
            out[pool] = total
        return out

    def ever_fits(self, pool: str, request: Mapping[str, int]) -> bool:
        """Whether some node of ``pool`` could hold ``request`` when empty."""
        for state in self.by_pool.get(pool, ()):
            if state.suits(request) and all(
                state.capacity.get(k, 0) >= v for k, v in request.items()
            ):
                return True
        return False

    def version(self, pool: str) -> int:
        """How many times the pool's free capacity changed (a key for caches)."""
        return self._version.get(pool, 0)

    def free_gpus(self, pool: str) -> int:
        """Whole free GPUs in the pool (milli-units)."""
        return self._whole_free.get(pool, 0) * MILLI

    def most_whole_free(self, pool: str) -> int:
        """The most whole free GPUs on one node of ``pool``."""
        buckets = self._buckets.get(pool, [])
        for count in range(len(buckets) - 1, 0, -1):
            if buckets[count]:
                return count
        return 0

    def largest_free(self, pool: str) -> dict[str, int]:
        """The free resources of a node with the most free GPUs (then CPU, among the
        first few such nodes): the "largest free slot" shown in reasons."""
        for bucket in reversed(self._buckets.get(pool, [])):
            if bucket:
                best = max(list(bucket.values())[:32], key=lambda s: s.free.get(CPU, 0))
                return dict(best.free)
        return {}

    # ---------------------------------------------------------------- changes

    def allocate(self, placements: Iterable[ReplicaPlacement], side: int | None = None) -> None:
        """Take the placements' resources and devices (they must be free), for a job of
        ``side`` (:data:`OWNER`, :data:`GUEST`, None: neither)."""
        self._apply(placements, -1, side)

    def release(self, placements: Iterable[ReplicaPlacement], side: int | None = None) -> None:
        """Give back what :meth:`allocate` took."""
        self._apply(placements, 1, side)

    def _apply(self, placements: Iterable[ReplicaPlacement], sign: int, side: int | None) -> None:
        for placement in placements:
            state = self.nodes.get(placement.node)
            if state is None:
                continue  # node gone or unhealthy: nothing to account
            before = state.whole_free
            state.apply(placement, sign)
            if side is not None:
                state.held[side] -= sign * placement.resources.get(GPU, 0)
            self._version[state.pool] = self._version.get(state.pool, 0) + 1
            if state.whole_free != before:
                self._whole_free[state.pool] += state.whole_free - before
                buckets = self._buckets[state.pool]
                del buckets[before][state.name]
                buckets[state.whole_free][state.name] = state

    # ---------------------------------------------------------------- placing

    def place(
        self,
        pool: str,
        replicas: Sequence[ReplicaRequest],
        *,
        claims: Claims | None = None,
        side: int | None = None,
    ) -> PlacementResult:
        """Find a placement for every replica of a job in ``pool`` without changing
        anything, avoiding capacity held in ``claims``, for a job of ``side`` (which
        nodes it prefers)."""
        flat: list[Replica] = [(g.name, i, g.resources) for g in replicas for i in range(g.count)]
        if not flat:
            return PlacementResult()
        if not self.by_pool.get(pool):
            return PlacementResult(reason=_no_fit(pool, flat[0][2], {}, "the pool has no nodes"))
        if len(flat) == 1:
            state = self._pick(flat[0][2], pool, None, {}, claims, side)
            if state is None:
                return PlacementResult(reason=self._no_fit(pool, flat[0][2]))
            return self._assign(flat, [state])
        return self._place_gang(pool, flat, claims, side)

    def _place_gang(
        self, pool: str, flat: list[Replica], claims: Claims | None, side: int | None
    ) -> PlacementResult:
        ordered = sorted(flat, key=lambda r: (-r[2].get(GPU, 0), -r[2].get(CPU, 0)))
        total_gpu = sum(r[2].get(GPU, 0) for r in flat)
        all_whole = all(r[2].get(GPU, 0) % MILLI == 0 for r in flat)
        # Cheap bound: with every replica asking at least `least` whole GPUs, a node with
        # f free GPUs holds at most f // least of them.
        least = min(r[2].get(GPU, 0) for r in flat) // MILLI if all_whole else 0
        if all_whole and (
            total_gpu > self.free_gpus(pool)
            or (
                least
                and sum(
                    (count // least) * len(bucket)
                    for count, bucket in enumerate(self._buckets[pool])
                )
                < len(flat)
            )
        ):
            return PlacementResult(reason=self._gang_reason(pool, ordered, claims))
        # 1. one node
        if all_whole:
            total: dict[str, int] = {}
            for _, _, request in flat:
                for key, amount in request.items():
                    total[key] = total.get(key, 0) + amount
            one = self._pick(total, pool, None, {}, claims, side)
            if one is not None:
                return self._assign(ordered, [one] * len(ordered))
        # 2. one rack or block, tightest group first
        for groups in self._groups[pool]:
            candidates = []
            for label, members in groups.items():
                room = sum(s.whole_free for s in members) * MILLI
                if not all_whole or (
                    room >= total_gpu
                    and (not least or sum(s.whole_free // least for s in members) >= len(flat))
                ):
                    candidates.append((room, label, members))
            candidates.sort(key=lambda c: (c[0], c[1]))
            for _, _, members in candidates:
                chosen = self._pack(ordered, pool, members, claims, side=side)
                if chosen is not None:
                    return self._assign(ordered, chosen)
        # 3. the whole pool
        chosen = self._pack(ordered, pool, None, claims, side=side)
        if chosen is not None:
            return self._assign(ordered, chosen)
        return PlacementResult(reason=self._gang_reason(pool, ordered, claims))

    def _no_fit(self, pool: str, request: Mapping[str, int]) -> Reason:
        """Why one replica of ``request`` fits on no node of ``pool`` (cached until the
        pool's free capacity changes)."""
        version = self._version.get(pool, 0)
        key = (pool, *sorted(request.items()))
        known = self._no_fits.get(key)
        if known is not None and known[0] == version:
            return known[1]
        if len(self._no_fits) >= 4096:  # memory stays bounded
            self._no_fits.clear()
        reason = _no_fit(pool, request, self.largest_free(pool))
        self._no_fits[key] = (version, reason)
        return reason

    def _gang_reason(self, pool: str, ordered: list[Replica], claims: Claims | None) -> Reason:
        placeable = len(self._pack(ordered, pool, None, claims, partial=True) or [])
        if placeable == 0:
            return self._no_fit(pool, ordered[0][2])
        return Reason(
            ReasonCode.GANG_UNSATISFIABLE,
            f"pool {pool}: only {placeable} of {len(ordered)} replicas fit at once; a gang "
            "starts all together or not at all",
            {
                "pool": pool,
                "replicas": len(ordered),
                "placeable": placeable,
                "largest_free": _show(self.largest_free(pool)),
            },
        )

    def _pack(
        self,
        ordered: list[Replica],
        pool: str,
        members: list[NodeState] | None,
        claims: Claims | None,
        *,
        partial: bool = False,
        side: int | None = None,
    ) -> list[NodeState] | None:
        """Best-fit decreasing over ``members`` (None: the whole pool, through the
        free-GPU buckets), on scratch copies of the nodes it touches. None if some
        replica does not fit (with ``partial``, the replicas placed until then)."""
        scratch: dict[str, tuple[dict[str, int], list[int]]] = {}
        chosen: list[NodeState] = []
        for _, _, request in ordered:
            best = self._pick(request, pool, members, scratch, claims, side)
            if best is None:
                return chosen if partial else None
            if best.name not in scratch:
                scratch[best.name] = (dict(best.free), list(best.device_free))
            free, devices = scratch[best.name]
            for key, amount in request.items():
                free[key] = free.get(key, 0) - amount
            take_devices(devices, request.get(GPU, 0))
            chosen.append(best)
        return chosen

    def _pick(
        self,
        request: Mapping[str, int],
        pool: str,
        members: list[NodeState] | None,
        scratch: Mapping[str, tuple[dict[str, int], list[int]]],
        claims: Claims | None,
        side: int | None = None,
    ) -> NodeState | None:
        """The tightest node for one replica (fewest free whole GPUs, then least CPU),
        seeing the nodes in ``scratch`` as changed there; one that does not mix ``side``
        with the other side first."""
        best: NodeState | None = None
        best_key: tuple[int, int, int] | None = None
        whole, part = divmod(request.get(GPU, 0), MILLI)
        sized = GPU_MEMORY in request  # some nodes' devices may be too small for it
        if members is not None or (part and not whole) or scratch:
            pool_states = self.by_pool.get(pool, [])
            looked = (
                members
                if members is not None
                else (pool_states if part and not whole else [self.nodes[n] for n in scratch])
            )
            for state in looked:
                changed = scratch.get(state.name)
                if changed is None:
                    free, devices, full = state.free, state.device_free, state.whole_free
                else:
                    free, devices = changed
                    full = sum(1 for f in devices if f == MILLI)
                if whole > full or (sized and not state.suits(request)):
                    continue
                claim = claims.get(state.name) if claims else None
                if fits_in(free, devices, request, claim, full):
                    mixes = int(state.mixes(side))
                    if part and not whole:
                        tight = min(f for f in devices if f >= part)
                        key = (mixes, tight, full)
                    else:
                        key = (mixes, full, free.get(CPU, 0))
                    if best_key is None or key < best_key:
                        best, best_key = state, key
            if members is not None or (part and not whole):
                return best
        buckets = self._buckets[pool]
        for count in range(whole, len(buckets)):
            if best_key is not None and best_key[0] == 0 and count >= best_key[1]:
                break  # a node that mixes nothing and is as tight is known
            for state in buckets[count].values():
                if state.name in scratch or (sized and not state.suits(request)):
                    continue
                claim = claims.get(state.name) if claims else None
                if fits_in(state.free, state.device_free, request, claim, state.whole_free):
                    if not state.mixes(side):
                        return state  # the lowest bucket that fits is the tightest
                    if best_key is None or (1, count) < best_key[:2]:
                        best, best_key = state, (1, count, 0)
        return best

    def _assign(self, ordered: list[Replica], chosen: list[NodeState]) -> PlacementResult:
        device_use = {s.name: list(s.device_free) for s in chosen}
        placements = [
            ReplicaPlacement(
                group=name,
                index=index,
                node=state.name,
                resources=request,
                devices=tuple(take_devices(device_use[state.name], request.get(GPU, 0))),
            )
            for (name, index, request), state in zip(ordered, chosen, strict=True)
        ]
        placements.sort(key=lambda p: (p.group, p.index))
        return PlacementResult(
            placements=tuple(placements), nodes=tuple(dict.fromkeys(s.name for s in chosen))
        )


def per_node(placements: Iterable[ReplicaPlacement]) -> dict[str, dict[str, int]]:
    """What the placements hold on each node, summed."""
    out: dict[str, dict[str, int]] = {}
    for placement in placements:
        bucket = out.setdefault(placement.node, {})
        for key, amount in placement.resources.items():
            bucket[key] = bucket.get(key, 0) + amount
    return out


def fits_in(
    free: Mapping[str, int],
    devices: list[int],
    request: Mapping[str, int],
    claim: Mapping[str, int] | None,
    whole_free: int | None = None,
) -> bool:
    """Whether ``request`` fits in ``free`` and ``devices`` less ``claim``."""
    for key, amount in request.items():
        if amount > free.get(key, 0) - (claim.get(key, 0) if claim else 0):
            return False
    whole, part = divmod(request.get(GPU, 0), MILLI)
    if whole:
        full = whole_free if whole_free is not None else sum(1 for f in devices if f == MILLI)
        reserved = (claim.get(GPU, 0) + MILLI - 1) // MILLI if claim else 0
        return whole <= full - reserved
    if part:
        return any(f >= part for f in devices)
    return True


def take_devices(devices: list[int], gpu: int) -> list[int]:
    """Take ``gpu`` milli-GPUs from per-device free amounts in place: whole devices
    lowest index first, or the tightest device for a fraction. Returns the indexes."""
    whole, part = divmod(gpu, MILLI)
    picked: list[int] = []
    if whole:
        for i, f in enumerate(devices):
            if f == MILLI:
                picked.append(i)
                devices[i] = 0
                if len(picked) == whole:
                    break
    elif part:
        i = min((i for i, f in enumerate(devices) if f >= part), key=lambda i: (devices[i], i))
        devices[i] -= part
        picked.append(i)
    return picked


def _show(resources: Mapping[str, int]) -> dict[str, str]:
    return {k: format_quantity(k, v) for k, v in sorted(resources.items())}


def _no_fit(
    pool: str, request: Mapping[str, int], largest: Mapping[str, int], why: str | None = None
) -> Reason:
    wanted = ", ".join(f"{v} {k}" for k, v in _show(request).items() if request[k])
    slot = ", ".join(f"{v} {k}" for k, v in _show(largest).items() if k in request) or "nothing"
    message = (
        f"pool {pool}: {why}"
        if why
        else f"pool {pool}: no node has {wanted} free for one replica; largest free slot: {slot}"
    )
    return Reason(
        ReasonCode.NO_NODE_FITS,
        message,
        {"pool": pool, "requested": _show(request), "largest_free": _show(largest)},
    )
