"""Recording API calls in the audit trail, and reading it back.

:class:`AuditTrail` is ASGI middleware, the one place records are appended: every write
(``POST``, ``PUT``, ``PATCH``, ``DELETE`` under ``/api/v1``) and every sensitive read
(:data:`SENSITIVE_READS`: logs, the audit trail itself, tokens), whatever its answer —
refusals (4xx) included. The record is committed before the last byte of the answer is
sent, so a client that got its answer finds the record.

Who asked comes from ``request.state.principal`` (attributes ``user``, ``tenant``,
``role``) when authentication has set one, else ``anonymous``; from where is the client
address. The control loop's own actions are not API calls: they are events.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from allotment.api import schemas
from allotment.api.gate import UI_PREFIX
from allotment.store import audit as audit_store
from allotment.store.batching import GroupCommit
from allotment.store.models import AuditRecord

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
ANONYMOUS = "anonymous"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DENIED_CODES = frozenset({"unauthenticated", "forbidden", "mount_not_allowed", "image_not_allowed"})
"""Error codes recorded as ``denied`` (besides any 401 or 403)."""
BODY_CAP = 64 * 1024
"""Answers longer than this are not parsed for the object's id or the error code."""
TEXT_CAP = 500


@dataclass(frozen=True, slots=True)
class Route:
    method: str | None
    """``None``: any method."""
    pattern: re.Pattern[str]
    action: str
    object: str
    """The object: a literal, or ``{0}`` for the path's first group."""


def _r(method: str | None, pattern: str, action: str, obj: str = "{0}") -> Route:
    return Route(method, re.compile(pattern), action, obj)


ROUTES: tuple[Route, ...] = (
    _r("POST", r"/jobs", "job.submit", "jobs"),
    _r("POST", r"/jobs:batch", "job.submit_batch", "jobs"),
    _r("POST", r"/jobs/([^/]+)/cancel", "job.cancel"),
    _r("PUT", r"/cluster", "cluster.apply", "cluster"),
    _r("POST", r"/services", "service.apply", "services"),
    _r("DELETE", r"/services/([^/]+/[^/]+)", "service.delete"),
    _r("GET", r"/jobs/([^/]+)/logs", "job.logs"),
    _r("GET", r"/audit", "audit.read", "audit"),
    _r("GET", r"/audit/verify", "audit.verify", "audit"),
    _r("GET", r"/tokens", "token.list", "tokens"),
    _r("POST", r"/tokens", "token.create", "tokens"),
    _r(None, r"/tokens/([^/]+)(?:/.*)?", "token.change"),
)
"""Named actions; any other write is recorded as ``<method> <path>``."""

SENSITIVE_READS = tuple(r for r in ROUTES if r.method == "GET")


UI_ROUTES: tuple[Route, ...] = (
    _r("POST", r"/ui/jobs/([^/]+)/cancel", "job.cancel"),
    _r("POST", r"/ui/admin/tokens/([^/]+)/revoke", "token.change"),
)
"""The dashboard's actions, recorded as the API's are; its pages are reads."""


def classify(
    method: str, path: str, *, routes: tuple[Route, ...] = ROUTES
) -> tuple[str, str] | None:
    """``(action, object)`` for a request to ``path`` (under ``/api/v1`` for
    :data:`ROUTES`, whole for :data:`UI_ROUTES`), or ``None`` when it is not audited."""
    for route in routes:
        if route.method not in (None, method):
            continue
        match = route.pattern.fullmatch(path)
        if match is not None:
            return route.action, route.object.format(*match.groups())
    if method in WRITE_METHODS:
        return f"{method.lower()} {path}", path
    return None


def _text(value: object, cap: int) -> str:
    """``value`` as text for a record: at most ``cap`` characters, NUL shown as ``\\0``
    (PostgreSQL keeps no NUL in text, and a record must never fail to be written)."""
    return str(value).replace("\x00", "\\0")[:cap]


def principal_of(state: object) -> tuple[str, str | None]:
    """``(user, tenant)`` of the principal on a request's state, or anonymous."""
    principal = getattr(state, "principal", None)
    user = getattr(principal, "user", None) or ANONYMOUS
    tenant = getattr(principal, "tenant", None)
    return str(user), (str(tenant) if tenant is not None else None)


class _StateView:
    """Attribute access over the ASGI scope's ``state`` dict (``request.state``)."""

    def __init__(self, scope: Scope) -> None:
        self._state = scope.get("state") or {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self._state[name]
        except KeyError:
            raise AttributeError(name) from None


def _parse(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def result_of(status: int, code: str | None) -> str:
    """``ok`` below 400; ``denied`` for 401, 403 and :data:`DENIED_CODES`; else the code."""
    if status < 400:
        return "ok"
    if status in (401, 403) or code in DENIED_CODES:
        return "denied"
    return code or str(status)


class AuditTrail:
    """ASGI middleware appending one audit record per audited request."""

    def __init__(self, app: ASGIApp, *, writes: GroupCommit, clock: Callable[[], float]) -> None:
        self.app = app
        self.writes = writes
        """Records are committed in groups with other requests' writes."""
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        method = str(scope.get("method", ""))
        what = None
        if scope["type"] == "http" and path.startswith(API_PREFIX + "/"):
            what = classify(method, path[len(API_PREFIX) :])
        elif scope["type"] == "http" and path.startswith(UI_PREFIX):
            what = classify(method, path, routes=UI_ROUTES)
        if what is None:
            await self.app(scope, receive, send)
            return
        # Made here so that what authentication puts on request.state is seen here even
        # where a router below passes on a copy of the scope (the copy shares this dict).
        scope.setdefault("state", {})
        status = 500
        chunks: list[bytes] = []
        size = 0
        recorded = False

        async def watch(message: Message) -> None:
            nonlocal status, size, recorded
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                size += len(body)
                if size <= BODY_CAP:
                    chunks.append(body)
                if not message.get("more_body", False) and not recorded:
                    recorded = True
                    answer = _parse(b"".join(chunks)) if size <= BODY_CAP else {}
                    await self._record(scope, what, status, answer)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            if not recorded:
                recorded = True
                await self._record(scope, what, 500, {"code": "internal"})
            raise

    async def _record(
        self, scope: Scope, what: tuple[str, str], status: int, answer: dict[str, Any]
    ) -> None:
        user, tenant = principal_of(_StateView(scope))
        fields = answer.get("fields") if isinstance(answer.get("fields"), dict) else {}
        assert isinstance(fields, dict)
        code = answer.get("code") if status >= 400 else None
        action, obj = what
        if action == "job.submit" and status < 400 and isinstance(answer.get("id"), str):
            obj = answer["id"]
        if tenant is None:
            found = answer.get("tenant") if status < 400 else fields.get("tenant")
            tenant = found if isinstance(found, str) else None
        detail: dict[str, Any] = {"status": status, "method": scope.get("method", "")}
        query = scope.get("query_string", b"")
        if query:
            detail["query"] = _text(query.decode("latin-1"), TEXT_CAP)
        if code is not None:
            detail["code"] = _text(code, 64)
            detail["message"] = _text(answer.get("message", ""), TEXT_CAP)
        client = scope.get("client")
        record = {
            "at": self.clock(),
            "user": _text(user, 128),
            "tenant": _text(tenant, 128) if tenant is not None else None,
            "action": _text(action, 64),
            "object": _text(obj, 512),
            "source": _text(client[0] if client else "unknown", 128),
            "result": _text(result_of(status, code if isinstance(code, str) else None), 64),
            "detail": detail,
        }
        try:
            await run_in_threadpool(self._append, record)
        except Exception:  # the answer still goes out; the failure is logged loudly
            log.exception("could not append the audit record %s", record)

    def _append(self, record: dict[str, Any]) -> None:
        self.writes.run(lambda db: audit_store.append(db, **record))


# ---------------------------------------------------------------- reading


def record_out(record: AuditRecord) -> schemas.AuditRecordOut:
    return schemas.AuditRecordOut(
        id=record.id,
        at=record.at,
        user=record.user,
        tenant=record.tenant,
        action=record.action,
        object=record.object,
        source=record.source,
        result=record.result,
        detail=dict(record.detail or {}),
        prev_hash=record.prev_hash,
        hash=record.hash,
    )


def list_audit(
    sessions: sessionmaker[Session],
    *,
    visible_tenant: str | None,
    user: str | None,
    tenant: str | None,
    action: str | None,
    object: str | None,
    since: float | None,
    until: float | None,
    after: int | None,
    limit: int,
) -> schemas.AuditPage:
    """A page of records by id. ``visible_tenant`` (the asker's tenant, when it has one)
    confines the answer to that tenant's records, whatever ``tenant`` asks for."""
    if visible_tenant is not None:
        if tenant is not None and tenant != visible_tenant:
            return schemas.AuditPage(records=[], next_after=None)
        tenant = visible_tenant
    with sessions() as db:
        rows = audit_store.list_records(
            db,
            user=user,
            tenant=tenant,
            action=action,
            object=object,
            since=since,
            until=until,
            after=after,
            limit=limit + 1,
        )
        page = [record_out(r) for r in rows[:limit]]
    more = len(rows) > limit
    return schemas.AuditPage(records=page, next_after=page[-1].id if more and page else None)


def verify_audit(sessions: sessionmaker[Session]) -> schemas.AuditVerifyOut:
    """Check the whole chain (blocks while it reads every record)."""
    with sessions() as db:
        verdict = audit_store.verify(db)
    bad = verdict.first_bad
    return schemas.AuditVerifyOut(
        ok=bad is None,
        first_bad=None if bad is None else schemas.AuditProblem(id=bad[0], problem=bad[1]),
        checked=verdict.checked,
        head_hash=verdict.head_hash,
    )
