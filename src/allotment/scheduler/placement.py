"""Placement: which nodes and devices a job's replicas get (R4.2, R4.3).

All replicas of a job are placed in one pool, all or none (gang). Whole-GPU replicas
take fully free devices and go to the node with the fewest free GPUs that still fits
(best fit); CPU, memory and every other resource must fit too. Multi-replica jobs
prefer one node, then one rack (or ``block``), then anywhere in the pool, choosing the
tightest group. A fractional GPU request (under one GPU) shares a device, best fit.

The index keeps, per pool, nodes bucketed by their number of fully free devices, so a
fit is found without scanning the fleet. Placement only reads; :meth:`Placer.allocate`
and :meth:`Placer.release` change free capacity and are exact inverses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from allotment.domain.cluster import Node
from allotment.domain.reasons import Reason, ReasonCode
from allotment.domain.resources import GPU, MILLI, format_quantity
from allotment.scheduler.snapshot import ReplicaPlacement, ReplicaRequest

TOPOLOGY_LEVELS = ("rack", "block")
"""Topology labels tried, in order, for compact placement of multi-replica jobs."""


class NodeState:
    """One schedulable node's free capacity, per-device free milli-GPU included."""

    __slots__ = ("capacity", "device_free", "free", "name", "pool", "topology", "whole_free")

    def __init__(self, node: Node) -> None:
        self.name = node.name
        self.pool = node.pool
        self.capacity = node.capacity.as_dict()
        self.free = dict(self.capacity)
        self.topology = dict(node.topology)
        count = self.capacity.get(GPU, 0) // MILLI
        self.device_free = [MILLI] * count
        self.whole_free = count

    def fits(self, request: Mapping[str, int], claim: Mapping[str, int] | None = None) -> bool:
        free = self.free
        for key, amount in request.items():
            have = free.get(key, 0) - (claim.get(key, 0) if claim else 0)
            if amount > have:
                return False
        gpu = request.get(GPU, 0)
        if gpu:
            whole, part = divmod(gpu, MILLI)
            reserved_whole = (claim.get(GPU, 0) + MILLI - 1) // MILLI if claim else 0
            if whole and whole > self.whole_free - reserved_whole:
                return False
            if part and not whole:
                return any(f >= part for f in self.device_free)
        return True

    def choose_devices(self, gpu: int) -> tuple[int, ...]:
        whole, part = divmod(gpu, MILLI)
        if whole:
            chosen = [i for i, f in enumerate(self.device_free) if f == MILLI][:whole]
            return tuple(chosen)
        if part:
            best = min(
                (i for i, f in enumerate(self.device_free) if f >= part),
                key=lambda i: (self.device_free[i], i),
            )
            return (best,)
        return ()


@dataclass(slots=True)
class PlacementResult:
    """A placement (``placements`` set) or why none (``reason``)."""

    placements: tuple[ReplicaPlacement, ...] = ()
    reason: Reason | None = None
    nodes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.reason is None


Claims = Mapping[str, Mapping[str, int]]
"""Per node, capacity held back for backfill reservations."""


class Placer:
    """Free capacity of every healthy node, indexed per pool for fast best fit."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.by_pool: dict[str, list[NodeState]] = {}
        self._buckets: dict[str, list[dict[str, NodeState]]] = {}
        self._max_devices: dict[str, int] = {}
        for node in nodes:
            if not node.healthy:
                continue
            state = NodeState(node)
            self.nodes[node.name] = state
            self.by_pool.setdefault(node.pool, []).append(state)
        for pool, states in self.by_pool.items():
            top = max((len(s.device_free) for s in states), default=0)
            self._max_devices[pool] = top
            buckets: list[dict[str, NodeState]] = [{} for _ in range(top + 1)]
            for state in states:
                buckets[state.whole_free][state.name] = state
            self._buckets[pool] = buckets

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
            if all(state.capacity.get(k, 0) >= v for k, v in request.items()):
                return True
        return False

    def largest_free(self, pool: str) -> dict[str, int]:
        """The free resources of the node with the most free GPUs (then CPU)."""
        best: NodeState | None = None
        for state in self.by_pool.get(pool, ()):
            if best is None or (state.whole_free, state.free.get("cpu", 0)) > (
                best.whole_free,
                best.free.get("cpu", 0),
            ):
                best = state
        return dict(best.free) if best is not None else {}

    # ---------------------------------------------------------------- changes

    def _move(self, state: NodeState, before: int) -> None:
        if state.whole_free != before:
            buckets = self._buckets[state.pool]
            del buckets[before][state.name]
            buckets[state.whole_free][state.name] = state

    def allocate(self, placements: Iterable[ReplicaPlacement]) -> None:
        """Take the placements' resources and devices (they must be free)."""
        self._apply(placements, -1)

    def release(self, placements: Iterable[ReplicaPlacement]) -> None:
        """Give back what :meth:`allocate` took."""
        self._apply(placements, 1)

    def _apply(self, placements: Iterable[ReplicaPlacement], sign: int) -> None:
        for placement in placements:
            state = self.nodes.get(placement.node)
            if state is None:
                continue  # node gone or unhealthy: nothing to account
            before = state.whole_free
            for key, amount in placement.resources.items():
                state.free[key] = state.free.get(key, 0) + sign * amount
            gpu = placement.resources.get(GPU, 0)
            if gpu and placement.devices:
                per_device = MILLI if gpu >= MILLI else gpu
                for index in placement.devices:
                    if index < len(state.device_free):
                        state.device_free[index] += sign * per_device
                state.whole_free = sum(1 for f in state.device_free if f == MILLI)
            self._move(state, before)

    # ---------------------------------------------------------------- placing

    def place(
        self,
        pool: str,
        replicas: Sequence[ReplicaRequest],
        *,
        claims: Claims | None = None,
    ) -> PlacementResult:
        """Find a placement for every replica of a job in ``pool`` without changing
        anything, avoiding capacity held in ``claims``."""
        flat = [(g.name, i, g.resources) for g in replicas for i in range(g.count)]
        if not flat:
            return PlacementResult()
        states = self.by_pool.get(pool)
        if not states:
            return PlacementResult(reason=_no_fit(pool, flat[0][2], {}, "the pool has no nodes"))
        if len(flat) == 1:
            name, index, request = flat[0]
            state = self._best_single(pool, request, claims)
            if state is None:
                return PlacementResult(reason=_no_fit(pool, request, self.largest_free(pool)))
            devices = state.choose_devices(request.get(GPU, 0))
            return PlacementResult(
                placements=(
                    ReplicaPlacement(
                        group=name, index=index, node=state.name, resources=request, devices=devices
                    ),
                ),
                nodes=(state.name,),
            )
        return self._place_gang(pool, flat, states, claims)

    def _best_single(
        self, pool: str, request: Mapping[str, int], claims: Claims | None
    ) -> NodeState | None:
        gpu = request.get(GPU, 0)
        whole, part = divmod(gpu, MILLI)
        if part and not whole:
            return self._best_fraction(pool, request, part, claims)
        buckets = self._buckets[pool]
        for count in range(whole, len(buckets)):
            for state in buckets[count].values():
                claim = claims.get(state.name) if claims else None
                if state.fits(request, claim):
                    return state
        return None

    def _best_fraction(
        self, pool: str, request: Mapping[str, int], part: int, claims: Claims | None
    ) -> NodeState | None:
        best: NodeState | None = None
        best_key = (MILLI + 1, 0)
        for state in self.by_pool[pool]:
            claim = claims.get(state.name) if claims else None
            if not state.fits(request, claim):
                continue
            tight = min(f for f in state.device_free if f >= part)
            key = (tight, state.whole_free)
            if key < best_key:
                best, best_key = state, key
        return best

    def _place_gang(
        self,
        pool: str,
        flat: list[tuple[str, int, Mapping[str, int]]],
        states: list[NodeState],
        claims: Claims | None,
    ) -> PlacementResult:
        ordered = sorted(flat, key=lambda r: (-r[2].get(GPU, 0), -r[2].get("cpu", 0)))
        total_gpu = sum(r[2].get(GPU, 0) for r in flat)
        all_whole = all(r[2].get(GPU, 0) % MILLI == 0 for r in flat)
        if all_whole and total_gpu > sum(s.whole_free for s in states) * MILLI:
            placeable = self._count_placeable(ordered, states, claims)
            return PlacementResult(reason=_gang_reason(pool, flat, placeable, self))
        # 1. one node
        best_one: NodeState | None = None
        total: dict[str, int] = {}
        for _, _, request in flat:
            for key, amount in request.items():
                total[key] = total.get(key, 0) + amount
        if all_whole:
            best_one = self._best_single(pool, total, claims)
        if best_one is not None:
            return self._assign(ordered, [best_one] * len(ordered))
        # 2. one rack or block, tightest group first; 3. the whole pool
        for level in TOPOLOGY_LEVELS:
            groups: dict[str, list[NodeState]] = {}
            for state in states:
                label = state.topology.get(level)
                if label is not None:
                    groups.setdefault(label, []).append(state)
            if not groups or (len(groups) == 1 and len(states) == sum(map(len, groups.values()))):
                continue  # no such label, or one group holding the whole pool
            candidates = []
            for label, members in groups.items():
                room = sum(s.whole_free for s in members) * MILLI
                if room >= total_gpu or not all_whole:
                    candidates.append((room, label, members))
            for _, _, members in sorted(candidates, key=lambda c: (c[0], c[1])):
                chosen = self._pack(ordered, members, claims)
                if chosen is not None:
                    return self._assign(ordered, chosen)
        chosen = self._pack(ordered, states, claims)
        if chosen is not None:
            return self._assign(ordered, chosen)
        placeable = self._count_placeable(ordered, states, claims)
        return PlacementResult(reason=_gang_reason(pool, flat, placeable, self))

    def _pack(
        self,
        ordered: list[tuple[str, int, Mapping[str, int]]],
        members: list[NodeState],
        claims: Claims | None,
        *,
        partial: bool = False,
    ) -> list[NodeState] | None:
        """Best-fit decreasing on scratch copies of the members' free capacity; None if
        some replica does not fit (with ``partial``, the replicas placed until then)."""
        scratch = {s.name: (dict(s.free), list(s.device_free)) for s in members}
        chosen: list[NodeState] = []
        for _, _, request in ordered:
            best: NodeState | None = None
            best_key: tuple[int, int] | None = None
            gpu = request.get(GPU, 0)
            whole, part = divmod(gpu, MILLI)
            for state in members:
                free, devices = scratch[state.name]
                claim = claims.get(state.name) if claims else None
                if any(
                    amount > free.get(k, 0) - (claim.get(k, 0) if claim else 0)
                    for k, amount in request.items()
                ):
                    continue
                full = sum(1 for f in devices if f == MILLI)
                if whole and whole > full:
                    continue
                if part and not whole and not any(f >= part for f in devices):
                    continue
                key = (full, free.get("cpu", 0))
                if best_key is None or key < best_key:
                    best, best_key = state, key
            if best is None:
                return chosen if partial else None
            free, devices = scratch[best.name]
            for k, amount in request.items():
                free[k] = free.get(k, 0) - amount
            if whole:
                taken = 0
                for i, f in enumerate(devices):
                    if f == MILLI and taken < whole:
                        devices[i] = 0
                        taken += 1
            elif part:
                i = min(
                    (i for i, f in enumerate(devices) if f >= part), key=lambda i: (devices[i], i)
                )
                devices[i] -= part
            chosen.append(best)
        return chosen

    def _count_placeable(
        self,
        ordered: list[tuple[str, int, Mapping[str, int]]],
        states: list[NodeState],
        claims: Claims | None,
    ) -> int:
        return len(self._pack(ordered, states, claims, partial=True) or [])

    def _assign(
        self, ordered: list[tuple[str, int, Mapping[str, int]]], chosen: list[NodeState]
    ) -> PlacementResult:
        device_use = {s.name: list(s.device_free) for s in chosen}
        placements = []
        for (name, index, request), state in zip(ordered, chosen, strict=True):
            devices = device_use[state.name]
            gpu = request.get(GPU, 0)
            whole, part = divmod(gpu, MILLI)
            picked: list[int] = []
            if whole:
                for i, f in enumerate(devices):
                    if f == MILLI and len(picked) < whole:
                        picked.append(i)
                        devices[i] = 0
            elif part:
                i = min(
                    (i for i, f in enumerate(devices) if f >= part), key=lambda i: (devices[i], i)
                )
                devices[i] -= part
                picked.append(i)
            placements.append(
                ReplicaPlacement(
                    group=name,
                    index=index,
                    node=state.name,
                    resources=request,
                    devices=tuple(picked),
                )
            )
        placements.sort(key=lambda p: (p.group, p.index))
        return PlacementResult(
            placements=tuple(placements), nodes=tuple(dict.fromkeys(s.name for s in chosen))
        )


def _show(resources: Mapping[str, int]) -> dict[str, str]:
    return {k: format_quantity(k, v) for k, v in sorted(resources.items())}


def _no_fit(
    pool: str, request: Mapping[str, int], largest: Mapping[str, int], why: str | None = None
) -> Reason:
    wanted = ", ".join(f"{v} {k}" for k, v in _show(request).items())
    slot = ", ".join(f"{v} {k}" for k, v in _show(largest).items() if k in request) or "nothing"
    return Reason(
        ReasonCode.NO_NODE_FITS,
        (why and f"pool {pool}: {why}")
        or f"pool {pool}: no node has {wanted} free for one replica; largest free slot: {slot}",
        {"pool": pool, "requested": _show(request), "largest_free": _show(largest)},
    )


def _gang_reason(
    pool: str, flat: list[tuple[str, int, Mapping[str, int]]], placeable: int, placer: Placer
) -> Reason:
    if placeable == 0:
        return _no_fit(pool, flat[0][2], placer.largest_free(pool))
    return Reason(
        ReasonCode.GANG_UNSATISFIABLE,
        f"pool {pool}: only {placeable} of {len(flat)} replicas fit at once; a gang starts "
        "all together or not at all",
        {
            "pool": pool,
            "replicas": len(flat),
            "placeable": placeable,
            "largest_free": _show(placer.largest_free(pool)),
        },
    )


def scratch_copy(placer: Placer, pool: str) -> Placer:
    """A separate placer over copies of one pool's nodes, for look-ahead."""
    copy = Placer(())
    states = []
    for state in placer.by_pool.get(pool, ()):
        twin = NodeState.__new__(NodeState)
        twin.name = state.name
        twin.pool = state.pool
        twin.capacity = state.capacity
        twin.free = dict(state.free)
        twin.topology = state.topology
        twin.device_free = list(state.device_free)
        twin.whole_free = state.whole_free
        copy.nodes[twin.name] = twin
        states.append(twin)
    copy.by_pool[pool] = states
    top = max((len(s.device_free) for s in states), default=0)
    copy._max_devices[pool] = top
    buckets: list[dict[str, NodeState]] = [{} for _ in range(top + 1)]
    for twin in states:
        buckets[twin.whole_free][twin.name] = twin
    copy._buckets[pool] = buckets
    return copy
