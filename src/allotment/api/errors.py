"""The one place errors become HTTP: ``AllotmentError`` by class, request validation, the rest.

Each response body is ``{code, message, fields}``. User errors are 4xx; anything
unexpected is a 500 with code ``internal`` and no stack trace in the body.
"""

from __future__ import annotations

import errno
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from allotment.domain.errors import (
    AllotmentError,
    Conflict,
    Forbidden,
    IllegalTransition,
    InvalidInput,
    NotFound,
    Unauthenticated,
)

log = logging.getLogger(__name__)


class BatchTooLarge(InvalidInput):
    """More specs in one batch submission than the server accepts."""

    code = "batch_too_large"


class IdempotencyKeyReused(Conflict):
    """An ``Idempotency-Key`` sent again with another request than the first time."""

    code = "idempotency_key_reused"


STATUS_BY_CLASS: tuple[tuple[type[AllotmentError], int], ...] = (
    (NotFound, 404),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (BatchTooLarge, 413),
    (IllegalTransition, 409),
    (Conflict, 409),
    (InvalidInput, 422),  # ConfigError and InvalidQuantity included
)
"""First match wins, so subclasses come before their bases; any other AllotmentError is 400."""


def status_for(exc: AllotmentError) -> int:
    """The HTTP status of a domain error."""
    for cls, status in STATUS_BY_CLASS:
        if isinstance(exc, cls):
            return status
    return 400


def error_response(status: int, code: str, message: str, fields: dict[str, Any]) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"code": code, "message": message, "fields": fields}
    )


async def _allotment_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AllotmentError)
    return JSONResponse(status_code=status_for(exc), content=exc.to_dict())


def _location(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    issues = [
        {"path": _location(err.get("loc", ())), "message": str(err.get("msg", ""))}
        for err in exc.errors()
    ]
    lines = "; ".join(f"{i['path']}: {i['message']}" for i in issues)
    return error_response(
        422, "invalid_request", f"the request is not valid: {lines}", {"issues": issues}
    )


HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def allowed_methods(request: Request) -> list[str]:
    """Every method the API documents at the request's path (the router's own ``Allow``
    names only the first route that matched the path)."""
    methods: set[str] = set()
    paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
    for template, operations in paths.items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, request.url.path):
            methods.update(m.upper() for m in operations if m.upper() in HTTP_METHODS)
    return sorted(methods)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Routing errors (no such path, method not allowed) in the usual JSON shape."""
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    fields: dict[str, Any] = {}
    if exc.status_code == 405:
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        fields["allowed"] = allowed
        message = f"{request.method} is not allowed on {request.url.path}; use " + (
            ", ".join(allowed) or "nothing"
        )
    elif exc.status_code == 404:
        message = f"no such endpoint: {request.url.path}"
    else:
        message = str(exc.detail)
    response = error_response(exc.status_code, code, message, fields)
    response.headers.update(headers)
    return response


_FULL_TEXTS = ("database or disk is full", "no space left on device", "could not extend file")


def storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the store's disk is full: SQLite's
    "database or disk is full", PostgreSQL's ``disk_full`` (SQLSTATE 53100), or an
    ``OSError`` ``ENOSPC``."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if getattr(current, "sqlstate", None) == "53100":
            return True
        if any(text in str(current).lower() for text in _FULL_TEXTS):
            return True
        stack += [current.__cause__, current.__context__, getattr(current, "orig", None)]
    return False


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    if storage_full(exc):
        log.error("the store's disk is full (%s %s): %s", request.method, request.url.path, exc)
        return error_response(
            503,
            "storage_full",
            "the store's disk is full, so nothing was changed; free space on it and try "
            "again (the server recovers by itself)",
            {},
        )
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the detail", {})


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(AllotmentError, _allotment_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
