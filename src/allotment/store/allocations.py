"""Allocations as the store keeps them (``Attempt.allocation``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from allotment.scheduler.snapshot import ReplicaPlacement


def allocation_json(placements: Sequence[ReplicaPlacement]) -> list[Any]:
    """Placements as stored in ``Attempt.allocation``."""
    return [
        {
            "group": p.group,
            "index": p.index,
            "node": p.node,
            "resources": dict(p.resources),
            "devices": list(p.devices),
        }
        for p in placements
    ]


def placements_from_json(allocation: Sequence[Any]) -> tuple[ReplicaPlacement, ...]:
    """The inverse of :func:`allocation_json`."""
    return tuple(
        ReplicaPlacement(
            group=str(item["group"]),
            index=int(item["index"]),
            node=str(item["node"]),
            resources={str(k): int(v) for k, v in dict(item.get("resources", {})).items()},
            devices=tuple(int(d) for d in item.get("devices", ())),
        )
        for item in allocation
    )
