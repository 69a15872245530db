"""Whether a job could ever run on a cluster: all of its replicas at once on the nodes
of one acceptable pool, every node empty and up. A job that could not is refused at
submit, saying what the largest node has, instead of waiting forever."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from allotment.domain.cluster import Cluster
from allotment.domain.resources import CPU, GPU, MEMORY, Resources
from allotment.scheduler.gates import shape_of
from allotment.scheduler.placement import NodeState, Placer
from allotment.scheduler.snapshot import ReplicaRequest

MAX_KNOWN = 4096
"""Answers kept per cluster (job shapes repeat: most submissions are answered from here)."""


def _size(node: NodeState) -> tuple[int, int, int]:
    return (node.capacity.get(GPU, 0), node.capacity.get(CPU, 0), node.capacity.get(MEMORY, 0))


def _shown(amounts: Mapping[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in Resources(amounts).display().items()) or "nothing"


class FleetFit:
    """The empty fleet of one cluster (every node, up or down), with what it learnt of
    job shapes cached; build a new one when the cluster changes."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._placer = Placer([NodeState(node) for node in cluster.nodes.values()])
        self._known: dict[tuple[object, ...], str | None] = {}

    def problem(self, replicas: Sequence[ReplicaRequest], pools: Sequence[str]) -> str | None:
        """Why the replicas could never all run at once in any of ``pools``, or None.
        None too when those pools have no nodes yet (an executor that reports its nodes
        has not reported them): nothing is known to be impossible then."""
        key = (tuple(pools), tuple((g.name, g.count, shape_of(g.resources)) for g in replicas))
        if key not in self._known:
            if len(self._known) >= MAX_KNOWN:  # memory stays bounded
                self._known.clear()
            self._known[key] = self._problem(replicas, pools)
        return self._known[key]

    def _problem(self, replicas: Sequence[ReplicaRequest], pools: Sequence[str]) -> str | None:
        nodes = [n for pool in pools for n in self._placer.by_pool.get(pool, ())]
        if not nodes:
            return None
        for pool in pools:
            if not self._placer.by_pool.get(pool):
                continue
            if all(self._placer.ever_fits(pool, g.resources) for g in replicas) and (
                self._placer.empty(pool).place(pool, replicas).ok
            ):
                return None
        where = f"pool{'s' if len(pools) > 1 else ''} {', '.join(pools)}"
        largest = max(nodes, key=_size)
        biggest = f"the largest node, {largest.name}, has {_shown(largest.capacity)}"
        for group in replicas:
            if not any(self._placer.ever_fits(pool, group.resources) for pool in pools):
                # A resource no node there declares at all is the answer, not the sizes.
                undeclared = sorted(
                    name
                    for name, amount in group.resources.items()
                    if amount > 0 and not any(node.capacity.get(name, 0) for node in nodes)
                )
                if undeclared:
                    biggest = f"no node there declares {', '.join(undeclared)}; {biggest}"
                return (
                    f"one replica of group {group.name} asks for {_shown(group.resources)}, "
                    f"more than any node of {where} has: {biggest}"
                )
        count = sum(g.count for g in replicas)
        return (
            f"the job's {count} replicas can never all run at once on the nodes of {where}, "
            f"even with every node empty ({len(nodes)} node{'s' if len(nodes) > 1 else ''}; "
            f"{biggest})"
        )
