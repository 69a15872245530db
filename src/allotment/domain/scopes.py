"""Data isolation: a job may mount only what lies inside its tenant's data scopes.

Paths are compared in their resolved form, component by component: ``..``, ``.``,
symbolic links, repeated and trailing slashes are resolved first (``resolve``, by
default :func:`os.path.realpath`, which reads links on this machine), so
``/data/mine/../other`` is ``/data/other`` and ``/data/vision2`` is not inside
``/data/vision``. Object-store style sources (``s3://bucket/prefix``) are normalised
without the file system and match only scopes of the same scheme and bucket. A tenant
without data scopes may mount nothing.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Sequence

from allotment.domain.errors import Issue
from allotment.domain.job import Mount

Resolver = Callable[[str], str]

_URL = re.compile(r"([a-z][a-z0-9+.-]*)://([^/]+)(/.*)?", re.IGNORECASE)


def resolve_source(path: str, *, resolve: Resolver = os.path.realpath) -> str | None:
    """The resolved form of a mount source or a scope, or ``None`` when it is neither an
    absolute path nor ``scheme://bucket[/key]``. Reads symbolic links through
    ``resolve``; never raises for odd input."""
    if not path or "\x00" in path:
        return None
    url = _URL.fullmatch(path)
    if url is not None:
        scheme, bucket, key = url.group(1).lower(), url.group(2), url.group(3) or "/"
        rest = posixpath.normpath(key)
        rest = "/" + rest.lstrip("/") if rest not in ("/", ".") else ""
        return f"{scheme}://{bucket}{rest}"
    if "://" in path or not path.startswith("/"):
        return None
    try:
        resolved = resolve(path)
    except (OSError, ValueError):
        return None
    if not resolved.startswith("/"):
        return None
    return "/" + resolved.lstrip("/")


def within(path: str, scope: str) -> bool:
    """Whether resolved ``path`` is ``scope`` or lies below it (whole components)."""
    if path == scope:
        return True
    if "://" in scope or "://" in path:
        return path.startswith(scope.rstrip("/") + "/")
    return posixpath.commonpath([path, scope]) == scope


def check_mounts(
    mounts: Sequence[Mount],
    scopes: Sequence[str],
    *,
    tenant: str,
    resolve: Resolver = os.path.realpath,
) -> list[Issue]:
    """One issue per mount whose source does not resolve inside one of ``scopes`` (the
    tenant's declared data scopes); empty when every mount is allowed."""
    resolved_scopes = [s for s in (resolve_source(x, resolve=resolve) for x in scopes) if s]
    shown = ", ".join(scopes) if scopes else "none"
    issues: list[Issue] = []
    for i, mount in enumerate(mounts):
        source = resolve_source(mount.source, resolve=resolve)
        where = f"mounts.{i}.source"
        if source is None:
            issues.append(
                Issue(
                    path=where,
                    message=(
                        f"{mount.source!r} is not an absolute path or scheme://bucket/key; "
                        f"tenant {tenant!r} may mount only inside its data scopes ({shown})"
                    ),
                )
            )
            continue
        if any(within(source, scope) for scope in resolved_scopes):
            continue
        also = "" if source == mount.source else f" (resolves to {source!r})"
        why = (
            f"its data scopes are {shown}"
            if scopes
            else "it declares no data scopes, so its jobs may mount nothing"
        )
        issues.append(
            Issue(
                path=where,
                message=f"{mount.source!r}{also} is outside tenant {tenant!r}'s data: {why}",
            )
        )
    return issues
