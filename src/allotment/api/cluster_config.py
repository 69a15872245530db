"""Applying ``cluster.yaml`` through the API: validate, diff against the running cluster,
store the new version."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from allotment.api import schemas
from allotment.domain.cluster import Cluster, Queue

SOURCE = "cluster.yaml"


_WORD = re.compile(r"[A-Za-z0-9_-]+")


def _key(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` for a key that is not a plain word (a label such
    as ``example.com/rack``), so that a path reads back one way only."""
    if _WORD.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def field_changes(old: Any, new: Any, path: str = "") -> list[schemas.FieldChange]:
    """The leaves in which two JSON values differ, keys sorted: dicts key by key (a key
    on one side only is reported whole, ``None`` on the other), lists index by index
    (extra indices likewise), anything else by equality."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes: list[schemas.FieldChange] = []
        for key in sorted(set(old) | set(new)):
            where = _key(path, key)
            if key in old and key in new:
                changes += field_changes(old[key], new[key], where)
            else:
                changes.append(schemas.FieldChange(path=where, old=old.get(key), new=new.get(key)))
        return changes
    if isinstance(old, list) and isinstance(new, list):
        changes = []
        for i in range(max(len(old), len(new))):
            where = f"{path}[{i}]"
            if i < len(old) and i < len(new):
                changes += field_changes(old[i], new[i], where)
            else:
                first = old[i] if i < len(old) else None
                second = new[i] if i < len(new) else None
                changes.append(schemas.FieldChange(path=where, old=first, new=second))
        return changes
    return [] if old == new else [schemas.FieldChange(path=path, old=old, new=new)]


def _section(old: Mapping[str, Any], new: Mapping[str, Any]) -> schemas.SectionDiff:
    changed = sorted(name for name in set(old) & set(new) if old[name] != new[name])
    return schemas.SectionDiff(
        added=sorted(set(new) - set(old)),
        removed=sorted(set(old) - set(new)),
        changed=changed,
        fields={name: field_changes(old[name], new[name]) for name in changed},
    )


def _queue_form(queue: Queue) -> dict[str, Any]:
    """A queue's own settings and place in the tree (a change to a child is not a
    change to its parent). Field paths in the diff are relative to this form, so they
    keep its ``spec.`` prefix (``spec.quota.local.gpu``): ``tenant`` here is the
    resolved tenant, and ``spec.tenant`` the one written for this queue."""
    return {
        "spec": queue.spec.model_dump(mode="json", exclude={"children"}),
        "parent": queue.parent.name if queue.parent is not None else None,
        "tenant": queue.tenant,
    }


def diff(old: Cluster, new: Cluster) -> schemas.ClusterDiff:
    """What applying ``new`` over ``old`` adds, removes and changes, by name, with the
    changed fields of each changed object."""

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
