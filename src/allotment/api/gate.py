"""Where a request's token is found, and the write hook around the API.

:func:`presented_token` finds the token a request presents: the bearer token, else (the
dashboard) ``/?token=`` or the cookie that it sets. Authentication itself is
:mod:`allotment.api.auth` and :mod:`allotment.api.access`.

:class:`AfterWrite` calls a hook after every successful write (``POST``, ``PUT``,
``PATCH``, ``DELETE`` under ``/api/v1``): the server wakes the control loop with it, so
that a submission is scheduled at once rather than on the next tick.
"""

from __future__ import annotations

from collections.abc import Callable
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from allotment.domain.notebook import NOTEBOOK_PREFIX

API_PREFIX = "/api/v1"
TOKEN_COOKIE = "allot_token"
DASHBOARD_PATH = "/"
UI_PREFIX = "/ui/"
"""The dashboard's other pages, fragments and actions."""
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers", [])}


def presented_token(scope: Scope) -> str | None:
    """The bearer token of a request, else (the dashboard, reading) its ``?token=`` or
    its cookie, else ``None``. A write counts the bearer token only: a browser sends
    the cookie by itself, so a write made with it could be forged by another page —
    except to a notebook (``/nb/...``), whose JupyterLab checks its own token or XSRF
    cookie on every write, so that JupyterLab works in a browser signed in with the
    cookie, and the dashboard's own actions (``/ui/...``) sent by its htmx with the
    ``HX-Request`` header: a page of another site cannot add a header to a request here
    without a CORS preflight, which this server never grants."""
    headers = _headers(scope)
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    path = str(scope.get("path", ""))
    if str(scope.get("method", "GET")).upper() in WRITE_METHODS and not (
        path.startswith(NOTEBOOK_PREFIX + "/")
        or (path.startswith(UI_PREFIX) and headers.get(b"hx-request") == b"true")
    ):
        return None
    if path == DASHBOARD_PATH:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        tokens = query.get("token")
        if tokens:
            return str(tokens[0])
    cookie = headers.get(b"cookie")
    if cookie:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(cookie.decode("latin-1"))
        except Exception:  # a malformed cookie header is no token
            return None
        morsel = jar.get(TOKEN_COOKIE)
        if morsel is not None and morsel.value:
            return morsel.value
    return None


class AfterWrite:
    """Call ``hook`` after each successful write request under ``/api/v1`` or of the
    dashboard (``/ui/``)."""

    def __init__(self, app: ASGIApp, *, hook: Callable[[], None]) -> None:
        self.app = app
        self.hook = hook

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") not in WRITE_METHODS
            or not str(scope.get("path", "")).startswith((API_PREFIX, UI_PREFIX))
        ):
            await self.app(scope, receive, send)
            return
        status = 500

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receive, watch)
        if status < 400:
            self.hook()
