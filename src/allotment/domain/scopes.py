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
from allotment.domain.job import UNMOUNTABLE, Mount
from allotment.domain.tenancy import DataScope

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
    scopes: Sequence[DataScope | str],
    *,
    tenant: str,
    resolve: Resolver = os.path.realpath,
) -> list[Issue]:
    """One issue per mount whose source does not resolve inside one of ``scopes`` (the
    tenant's declared data scopes), or that would write where the scope is read-only;
    empty when every mount is allowed."""
    return resolve_mounts(mounts, scopes, tenant=tenant, resolve=resolve)[1]


def resolve_mounts(
    mounts: Sequence[Mount],
    scopes: Sequence[DataScope | str],
    *,
    tenant: str,
    resolve: Resolver = os.path.realpath,
) -> tuple[list[tuple[str, Mount]], list[Issue]]:
    """Each allowed mount with its resolved source (what to bind, so that a link
    changed later cannot lead elsewhere), and one issue per mount refused. A scope
    given as a string is read-only."""
    given = [s if isinstance(s, DataScope) else DataScope(path=s) for s in scopes]
    resolved_scopes = [
        (resolved, scope)
        for scope in given
        if (resolved := resolve_source(scope.path, resolve=resolve)) is not None
    ]
    shown = ", ".join(s.path + (" (writable)" if s.writable else "") for s in given) or "none"
    allowed: list[tuple[str, Mount]] = []
    issues: list[Issue] = []
    for i, mount in enumerate(mounts):
        source = resolve_source(mount.source, resolve=resolve)
        where = f"mounts.{i}.source"
        if source is not None and any(c in source for c in UNMOUNTABLE):
            issues.append(
                Issue(
                    path=where,
                    message=f"{mount.source!r} holds a comma, double quote or newline; rename it",
                )
            )
            continue
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
        inside = [scope for resolved, scope in resolved_scopes if within(source, resolved)]
        also = "" if source == mount.source else f" (resolves to {source!r})"
        if not inside:
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
            continue
        if not mount.read_only and not any(scope.writable for scope in inside):
            issues.append(
                Issue(
                    path=f"mounts.{i}.read_only",
                    message=(
                        f"{mount.source!r}{also} lies in a read-only data scope of tenant "
                        f"{tenant!r}; mount it with read_only: true, or ask for a writable scope"
                    ),
                )
            )
            continue
        allowed.append((source, mount))
    return allowed, issues
