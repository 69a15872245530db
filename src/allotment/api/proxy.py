"""The proxy to services and notebooks on the API server, with the API's tokens and
tenant scoping: ``/svc/<tenant>/<service>/<path>`` forwards to a ready replica of the
service (the path after the prefix), ``/nb/<job>/<path>`` to the notebook job's
JupyterLab (the whole path: JupyterLab serves under that prefix).

- **Who may call**: a service, any role of its tenant (``viewer`` and up), or anyone
  when it is ``public`` (its tenant must allow ``public_services``); a notebook,
  the user who started it, or an admin of its tenant; a platform admin either. The
  token is the API's bearer token, or a browser's dashboard cookie: for reads only on
  services, for writes too on notebooks, where JupyterLab's own token and XSRF check
  guard writes. Another tenant's endpoint is answered 404, as if it did not exist. The
  token never reaches the replica: a bearer ``Authorization`` and the dashboard cookie
  are removed before forwarding (another scheme, such as JupyterLab's ``token``, goes
  through); ``X-Forwarded-*`` say where the request came from.
- **Where it goes**: the replicas that passed their health check (read from the store,
  at most every quarter second), in turn; a notebook's one port while it runs. A
  replica that refuses the connection (it just died) is skipped and the request goes to
  the next, so one replica's death costs no request while another is ready; a
  connection that breaks after the request went out is retried the same way for
  idempotent methods, and answered ``502 bad_gateway`` for the others (they may have
  been done). With none answering the request waits up to :data:`WAIT_FOR_REPLICA_S`
  (a service scaling up or from zero, a notebook's server starting), except for a
  service in a crash loop or a notebook that is not running: then ``503
  service_unavailable`` with the reason at once.
- **Measured**: every request to a service counts as in flight from its arrival to its
  response's last byte (:class:`~allotment.control.services.ServiceTraffic`); the
  service controller scales on it.

Responses stream (``httpx``; nothing here parses HTTP). Websockets are forwarded too
(``websockets`` on the replica's side), which JupyterLab's kernels need.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
from fastapi import APIRouter, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from allotment.api.auth import Authenticator, authenticate
from allotment.api.gate import TOKEN_COOKIE, presented_token
from allotment.api.policy import Action, Owned, require
from allotment.api.services import PROXY_PREFIX, Route, Services
from allotment.control.services import REPLICA_HOST, ServiceTraffic
from allotment.domain.errors import AllotmentError, NotFound
from allotment.domain.notebook import NOTEBOOK_PREFIX, notebook_path

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

WAIT_FOR_REPLICA_S = 60.0
"""How long a request waits for a ready replica when none is (``app.state.proxy_wait_s``
overrides it)."""
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 300.0
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""Methods a request may be sent again with, to another replica, after a broken
connection (as HTTP defines them)."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers of one connection, never forwarded either way."""
NOT_FORWARDED = HOP_BY_HOP | {"authorization", "cookie", "content-length"}
"""Request headers not forwarded as they came: the cookie goes without the API's token,
``Authorization`` only when it is not a bearer token (JupyterLab's pages send
``Authorization: token <its token>``; the API's is a bearer token).
``Host`` is kept, as an ingress keeps it: JupyterLab checks a browser's ``Origin``
against it."""


class Upstreams:
    """One HTTP client per event loop (a client's connections belong to its loop), and
    the turn of replicas."""

    def __init__(self) -> None:
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._turn = itertools.count()

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None:
            timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
            found = self._clients[loop] = httpx.AsyncClient(timeout=timeout)
        return found

    def order(self, ports: tuple[int, ...]) -> list[int]:
        """``ports``, starting at the next in turn."""
        start = next(self._turn) % len(ports)
        return list(ports[start:] + ports[:start])


def _cookies_without_token(cookie: str | None) -> str:
    """The ``Cookie`` header without the dashboard's token cookie."""
    kept = [c.strip() for c in (cookie or "").split(";")]
    return "; ".join(c for c in kept if c and c.split("=", 1)[0] != TOKEN_COOKIE)


def _headers_for_replica(request: Request, prefix: str) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED]
    authorization = request.headers.get("authorization", "")
    if authorization and authorization.split(" ", 1)[0].lower() != "bearer":
        headers.append(("authorization", authorization))  # the replica's own (JupyterLab's)
    kept = _cookies_without_token(request.headers.get("cookie"))
    if kept:
        headers.append(("cookie", kept))
    client = request.client.host if request.client is not None else ""
    headers += [
        ("x-forwarded-for", client),
        ("x-forwarded-proto", request.url.scheme),
        ("x-forwarded-host", request.headers.get("host", "")),
        ("x-forwarded-prefix", prefix),
    ]
    return headers


def _bad_gateway(what: str, exc: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=502,
        content={
            "code": "bad_gateway",
            "message": f"{what} broke the connection before it answered "
            f"({type(exc).__name__}); the request may or may not have been done",
            "fields": {"endpoint": what},
        },
    )


def _unavailable(what: str, reason: str) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={
            "code": "service_unavailable",
            "message": f"{what} is not answering: {reason}",
            "fields": {"endpoint": what},
        },
        headers={"Retry-After": "5"},
    )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What one proxied request goes to: ``lookup()`` gives where it may go now;
    ``path`` is the path to ask the replica for; ``prefix`` the public prefix."""

    what: str
    lookup: Callable[[], Route | None]
    forget: Callable[[], None]
    path: str
    prefix: str


def _service(request: Request | WebSocket, tenant: str, name: str, path: str) -> Endpoint:
    book: Services = request.app.state.services
    return Endpoint(
        what=f"service {name}",
        lookup=lambda: book.route(tenant, name),
        forget=lambda: book.forget_route(tenant, name),
        path=f"/{path}",
        prefix=f"{PROXY_PREFIX}/{tenant}/{name}",
    )


def _notebook(request: Request | WebSocket, job_id: str, path: str) -> Endpoint:
    book: Services = request.app.state.services
    return Endpoint(
        what=f"notebook {job_id}",
        lookup=lambda: book.notebook_route(job_id),
        forget=lambda: book.forget_route("", job_id),
        path=notebook_path(job_id) + path,  # JupyterLab serves under its prefix
        prefix=notebook_path(job_id).rstrip("/"),
    )


async def _allowed(
    request: Request | WebSocket, action: Action, owned: Callable[[], Owned]
) -> None:
    """Authenticate (as the API does) and authorise ``action`` on the object; raises
    like the API (401, 403, or 404 for another tenant's)."""
    authenticator: Authenticator | None = getattr(request.app.state, "authenticator", None)
    who = await run_in_threadpool(authenticate, authenticator, presented_token(request.scope))
    request.state.principal = who
    require(who, action, await run_in_threadpool(owned))


@router.api_route(PROXY_PREFIX + "/{tenant}/{name}/{path:path}", methods=METHODS)
async def proxy_service(request: Request, tenant: str, name: str, path: str) -> Response:
    endpoint = _service(request, tenant, name, path)
    if not await _public(endpoint):
        owned = Owned(kind="service", name=name, tenant=tenant)
        await _allowed(request, Action.SERVICE_CALL, lambda: owned)
    return await _proxy(request, endpoint)


async def _public(endpoint: Endpoint) -> bool:
    """Whether the endpoint answers without a token (a public service): only then is
    it looked up before the caller is authenticated, so that whether a service exists
    never shows to a caller without a token."""
    route = await run_in_threadpool(endpoint.lookup)
    return route is not None and route.public


@router.api_route(NOTEBOOK_PREFIX + "/{job_id}/{path:path}", methods=METHODS)
async def proxy_notebook(request: Request, job_id: str, path: str) -> Response:
    book: Services = request.app.state.services
    await _allowed(request, Action.NOTEBOOK_OPEN, lambda: book.notebook_owned(job_id))
    return await _proxy(request, _notebook(request, job_id, path))


async def _proxy(request: Request, endpoint: Endpoint) -> Response:
    traffic: ServiceTraffic = request.app.state.traffic
    route = await _route(endpoint)
    traffic.begin(route.service_id)
    try:
        upstream = await _send(request, endpoint, route)
    except BaseException:
        traffic.end(route.service_id)
        raise
    if isinstance(upstream, Response):
        traffic.end(route.service_id)
        return upstream

    async def close() -> None:
        await upstream.aclose()
        traffic.end(route.service_id)

    headers = [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in HOP_BY_HOP]
    body: AsyncIterator[bytes] = upstream.aiter_raw()
    response = StreamingResponse(
        body, status_code=upstream.status_code, background=BackgroundTask(close)
    )
    response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return response


async def _route(endpoint: Endpoint) -> Route:
    route = await run_in_threadpool(endpoint.lookup)
    if route is None:
        kind, _, name = endpoint.what.partition(" ")
        raise NotFound(kind, name)
    return route


async def _send(request: Request, endpoint: Endpoint, route: Route) -> httpx.Response | Response:
    """The replica's response (streaming), trying the ready replicas in turn; or the
    503 when none answers in time."""
    upstreams: Upstreams = request.app.state.upstreams
    body = await request.body()
    headers = _headers_for_replica(request, endpoint.prefix)
    deadline = time.monotonic() + getattr(request.app.state, "proxy_wait_s", WAIT_FOR_REPLICA_S)
    refused: set[int] = set()
    client = upstreams.client()
    while True:
        ports = tuple(p for p in route.ports if p not in refused)
        for port in upstreams.order(ports) if ports else []:
            url = httpx.URL(
                f"http://{REPLICA_HOST}:{port}{endpoint.path}",
                query=request.url.query.encode("latin-1"),
            )
            outgoing = client.build_request(request.method, url, headers=headers, content=body)
            try:
                return await client.send(outgoing, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                refused.add(port)  # it died since it was last seen ready, or is starting
                endpoint.forget()
            except httpx.TransportError as exc:
                # The connection broke after the request went out (a kept-alive one to
                # a replica that died, or it died answering): only a request that may
                # be repeated goes to the next replica.
                refused.add(port)
                endpoint.forget()
                if request.method not in IDEMPOTENT:
                    return _bad_gateway(endpoint.what, exc)
        if not route.wait or time.monotonic() >= deadline:
            return _unavailable(endpoint.what, route.reason)
        await asyncio.sleep(0.2)
        endpoint.forget()
        route = await _route(endpoint)
        refused.clear()  # a replica still starting is tried again


# ---------------------------------------------------------------- websockets


@router.websocket(PROXY_PREFIX + "/{tenant}/{name}/{path:path}")
async def proxy_service_socket(websocket: WebSocket, tenant: str, name: str, path: str) -> None:
    owned = Owned(kind="service", name=name, tenant=tenant)
    endpoint = _service(websocket, tenant, name, path)
    if await _public(endpoint) or await _socket_allowed(
        websocket, Action.SERVICE_CALL, lambda: owned
    ):
        await _pump(websocket, endpoint)


@router.websocket(NOTEBOOK_PREFIX + "/{job_id}/{path:path}")
async def proxy_notebook_socket(websocket: WebSocket, job_id: str, path: str) -> None:
    book: Services = websocket.app.state.services
    if await _socket_allowed(websocket, Action.NOTEBOOK_OPEN, lambda: book.notebook_owned(job_id)):
        await _pump(websocket, _notebook(websocket, job_id, path))


async def _socket_allowed(websocket: WebSocket, action: Action, owned: Callable[[], Owned]) -> bool:
    """Authorise a websocket as :func:`_allowed` does a request; refuse the handshake
    (HTTP 403) when not allowed."""
    try:
        await _allowed(websocket, action, owned)
    except AllotmentError:
        await websocket.close(code=1008)
        return False
    return True


async def _pump(websocket: WebSocket, endpoint: Endpoint) -> None:
    """Connect to a ready replica's websocket and copy messages both ways until either
    side closes."""
    route = await run_in_threadpool(endpoint.lookup)
    if route is None or not route.ports:
        await websocket.close(code=1013)  # try again later
        return
    port = route.ports[0]
    query = websocket.url.query
    url = f"ws://{REPLICA_HOST}:{port}{endpoint.path}" + (f"?{query}" if query else "")
    cookie = websocket.headers.get("cookie")
    headers = [("x-forwarded-prefix", endpoint.prefix)]
    kept = _cookies_without_token(cookie)
    if kept:
        headers.append(("cookie", kept))
    offered = websocket.scope.get("subprotocols") or []
    try:
        upstream = await connect(
            url, additional_headers=headers, subprotocols=offered or None, proxy=None
        )
    except (OSError, WebSocketException):
        await websocket.close(code=1011)
        return
    await websocket.accept(subprotocol=upstream.subprotocol)

    async def inbound() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def outbound() -> None:
        async for message in upstream:
            if isinstance(message, bytes):
                await websocket.send_bytes(message)
            else:
                await websocket.send_text(message)

    async with upstream:
        tasks = [asyncio.create_task(inbound()), asyncio.create_task(outbound())]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None and not isinstance(
                task.exception(), WebSocketException | WebSocketDisconnect
            ):
                log.warning("websocket proxy of %s ended: %r", endpoint.what, task.exception())
    with contextlib.suppress(RuntimeError):
        await websocket.close()
