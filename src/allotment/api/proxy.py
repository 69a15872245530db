"""The service proxy: ``/svc/<tenant>/<service>/<path>`` on the API server forwards to a
ready replica of the service, with the API's tokens and tenant scoping.

- **Who may call**: any role of the service's tenant (``viewer`` and up) with the same
  bearer token as the API (or, for reads from a browser, the dashboard's cookie); a
  platform admin may call any. Another tenant's service is answered 404, as if it did
  not exist. The token never reaches the replica: ``Authorization`` and the dashboard
  cookie are removed before forwarding.
- **Where it goes**: the replicas that passed their health check (read from the store,
  at most every quarter second), in turn. A replica that refuses the connection (it
  just died) is skipped and the request goes to the next, so one replica's death costs
  no request while another is ready; a connection that breaks after the request went
  out is retried the same way for idempotent methods, and answered ``502 bad_gateway``
  for the others (they may have been done). With none ready the request waits up to
  :data:`WAIT_FOR_REPLICA_S` for one (a service scaling up, or from zero), except when
  the service is in a crash loop; then ``503 service_unavailable`` with the reason.
- **Measured**: every request counts as in flight from its arrival to its response's
  last byte (:class:`~allotment.control.services.ServiceTraffic`); the service
  controller scales on it.

Responses stream (``httpx`` in both directions; nothing here parses HTTP). Websockets
are not proxied.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from allotment.api.access import principal
from allotment.api.gate import TOKEN_COOKIE
from allotment.api.policy import Action, Owned, require
from allotment.api.services import PROXY_PREFIX, Route, Services
from allotment.control.services import REPLICA_HOST, ServiceTraffic
from allotment.domain.errors import NotFound

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
        "host",
    }
)
NOT_FORWARDED = HOP_BY_HOP | {"authorization", "cookie", "content-length"}


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


def _headers_for_replica(request: Request, prefix: str) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED]
    cookie = request.headers.get("cookie")
    if cookie:
        kept = [c for c in cookie.split(";") if c.strip().split("=", 1)[0] != TOKEN_COOKIE]
        if any(c.strip() for c in kept):
            headers.append(("cookie", ";".join(kept).strip()))
    client = request.client.host if request.client is not None else ""
    headers += [
        ("x-forwarded-for", client),
        ("x-forwarded-proto", request.url.scheme),
        ("x-forwarded-host", request.headers.get("host", "")),
        ("x-forwarded-prefix", prefix),
    ]
    return headers


def _bad_gateway(name: str, exc: Exception) -> JSONResponse:
    return JSONResponse(
        status_code=502,
        content={
            "code": "bad_gateway",
            "message": f"the replica of service {name} broke the connection before it "
            f"answered ({type(exc).__name__}); the request may or may not have been done",
            "fields": {"service": name},
        },
    )


def _unavailable(name: str, reason: str) -> JSONResponse:
    return JSONResponse(
        status_code=503,
        content={
            "code": "service_unavailable",
            "message": f"service {name} has no ready replica: {reason}",
            "fields": {"service": name},
        },
        headers={"Retry-After": "5"},
    )


async def _route(book: Services, tenant: str, name: str) -> Route:
    route = await run_in_threadpool(book.route, tenant, name)
    if route is None:
        raise NotFound("service", name)
    return route


@router.api_route(PROXY_PREFIX + "/{tenant}/{name}/{path:path}", methods=METHODS)
async def proxy(request: Request, tenant: str, name: str, path: str) -> Response:
    who = await run_in_threadpool(principal, request)
    require(who, Action.SERVICE_CALL, Owned(kind="service", name=name, tenant=tenant))
    book: Services = request.app.state.services
    traffic: ServiceTraffic = request.app.state.traffic
    upstreams: Upstreams = request.app.state.upstreams
    route = await _route(book, tenant, name)
    traffic.begin(route.service_id)
    try:
        upstream = await _send(request, book, upstreams, tenant, name, path, route)
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


async def _send(
    request: Request,
    book: Services,
    upstreams: Upstreams,
    tenant: str,
    name: str,
    path: str,
    route: Route,
) -> httpx.Response | Response:
    """The replica's response (streaming), trying the ready replicas in turn; or the
    503 when none answers in time."""
    body = await request.body()
    prefix = PROXY_PREFIX + f"/{tenant}/{name}"
    headers = _headers_for_replica(request, prefix)
    deadline = time.monotonic() + getattr(request.app.state, "proxy_wait_s", WAIT_FOR_REPLICA_S)
    refused: set[int] = set()
    client = upstreams.client()
    while True:
        ports = tuple(p for p in route.ports if p not in refused)
        for port in upstreams.order(ports) if ports else []:
            url = httpx.URL(
                f"http://{REPLICA_HOST}:{port}/{path}",
                query=request.url.query.encode("latin-1"),
            )
            outgoing = client.build_request(request.method, url, headers=headers, content=body)
            try:
                return await client.send(outgoing, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                refused.add(port)  # it died since it was last seen ready
                book.forget_route(tenant, name)
            except httpx.TransportError as exc:
                # The connection broke after the request went out (a kept-alive one to
                # a replica that died, or it died answering): only a request that may
                # be repeated goes to the next replica.
                refused.add(port)
                book.forget_route(tenant, name)
                if request.method not in IDEMPOTENT:
                    return _bad_gateway(name, exc)
        if route.code == "crash_loop" or time.monotonic() >= deadline:
            return _unavailable(name, route.reason)
        await asyncio.sleep(0.2)
        book.forget_route(tenant, name)
        route = await _route(book, tenant, name)
