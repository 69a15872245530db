"""Applying ``cluster.yaml`` through the API: validate, diff against the running cluster,
store the new version."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allotment.api import schemas
from allotment.domain.cluster import Cluster, Queue

SOURCE = "cluster.yaml"


def _section(old: Mapping[str, Any], new: Mapping[str, Any]) -> schemas.SectionDiff:
    return schemas.SectionDiff(
        added=sorted(set(new) - set(old)),
        removed=sorted(set(old) - set(new)),
        changed=sorted(name for name in set(old) & set(new) if old[name] != new[name]),
    )


def _queue_form(queue: Queue) -> dict[str, Any]:
    """A queue's own settings and place in the tree (a change to a child is not a
    change to its parent)."""
    return {
        "spec": queue.spec.model_dump(mode="json", exclude={"children"}),
        "parent": queue.parent.name if queue.parent is not None else None,
        "tenant": queue.tenant,
    }


def diff(old: Cluster, new: Cluster) -> schemas.ClusterDiff:
    """What applying ``new`` over ``old`` adds, removes and changes, by name."""

    def dumps(items: Mapping[str, Any]) -> dict[str, Any]:
        return {name: item.model_dump(mode="json") for name, item in items.items()}

    return schemas.ClusterDiff(
        priority_classes=_section(dumps(old.priority_classes), dumps(new.priority_classes)),
        pools=_section(dumps(old.pools), dumps(new.pools)),
        nodes=_section(dumps(old.nodes), dumps(new.nodes)),
        tenants=_section(dumps(old.tenants), dumps(new.tenants)),
        queues=_section(
            {n: _queue_form(q) for n, q in old.queues.items()},
            {n: _queue_form(q) for n, q in new.queues.items()},
        ),
    )
