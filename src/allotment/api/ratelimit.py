"""Rate limits: a token bucket per API token, in memory, as ASGI middleware.

Each bearer token (keyed by its SHA-256 digest, never the token itself) — or, for a
request without one, each client address — has a bucket of ``burst`` requests refilled
at ``per_second``. A token not yet known to be valid (one never answered otherwise than
401) also spends from its client address's bucket: rotating made-up tokens gets no
fresh bucket each time. A request finding a bucket empty gets 429, code
``rate_limited``, and ``Retry-After`` in whole seconds. Buckets live in this process
only: several servers each apply the limit on their own. At most ``max_keys`` buckets
are kept; the least recently used are forgotten first (a forgotten bucket starts full
again). Requests to services through the proxy (``/svc/...``) with a token known to be
valid are not limited.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from allotment.api.auth import token_digest
from allotment.api.gate import presented_token
from allotment.api.limits import send_error

OPEN_PATHS = frozenset({"/api/v1/healthz"})
"""Never limited: the health check."""
PROXIED = "/svc/"
"""Requests to services through the proxy: not limited once their token is known valid
(a service's load is what its replicas and autoscaling are for)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """``per_second`` sustained, ``burst`` at once, per token."""

    per_second: float = 20.0
    burst: int = 200
    max_keys: int = 10_000

    def __post_init__(self) -> None:
        if not (self.per_second > 0 and math.isfinite(self.per_second)):
            raise ValueError("per_second must be a positive number")
        if self.burst < 1 or self.max_keys < 1:
            raise ValueError("burst and max_keys must be at least 1")


SERVER_DEFAULT = RateLimit()
"""What ``allot up`` applies: generous for people and scripts, a stop for runaway loops."""


class TokenBuckets:
    """The buckets; :meth:`take` is the whole algorithm."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> float:
        """Spend one request from ``key``'s bucket: 0 when allowed, else the seconds
        until one is available."""
        now = self.clock()
        level, then = self._buckets.pop(key, (float(self.limit.burst), now))
        level = min(float(self.limit.burst), level + (now - then) * self.limit.per_second)
        wait = 0.0
        if level >= 1.0:
            level -= 1.0
        else:
            wait = (1.0 - level) / self.limit.per_second
        self._buckets[key] = (level, now)
        while len(self._buckets) > self.limit.max_keys:
            self._buckets.popitem(last=False)
        return wait


def request_keys(scope: Scope, known: Callable[[str], bool]) -> list[str]:
    """The buckets a request spends from: its token's (when it has one), and its
    address's unless the token is ``known`` to be valid."""
    keys = []
    token = presented_token(scope)
    if token is not None:
        keys.append("token:" + token_digest(token))
        if known(keys[0]):
            return keys
    client = scope.get("client")
    keys.append("addr:" + (str(client[0]) if client else "unknown"))
    return keys


class RateLimiter:
    """ASGI middleware refusing requests over the limit (the health check is exempt)."""

    def __init__(
        self, app: ASGIApp, *, limit: RateLimit, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.buckets = TokenBuckets(limit, clock)
        self._valid: OrderedDict[str, None] = OrderedDict()
        """Token buckets whose token was once answered otherwise than 401 (LRU)."""

    def _known(self, key: str) -> bool:
        if key in self._valid:
            self._valid.move_to_end(key)
            return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        keys = request_keys(scope, self._known)
        if keys[0] in self._valid and str(scope.get("path", "")).startswith(PROXIED):
            await self.app(scope, receive, send)  # a service's traffic is its own business
            return
        wait = max(self.buckets.take(key) for key in keys)
        if wait <= 0:
            if not keys[0].startswith("token:") or keys[0] in self._valid:
                await self.app(scope, receive, send)
                return
            token_key = keys[0]

            async def noting(message: Message) -> None:
                if message["type"] == "http.response.start" and message["status"] != 401:
                    self._valid[token_key] = None
                    while len(self._valid) > self.buckets.limit.max_keys:
                        self._valid.popitem(last=False)
                await send(message)

            await self.app(scope, receive, noting)
            return
        retry = max(1, math.ceil(wait))
        limit = self.buckets.limit
        await send_error(
            send,
            429,
            "rate_limited",
            f"too many requests: at most {limit.per_second:g} a second (bursts of "
            f"{limit.burst}) per token; retry in {retry}s",
            {"retry_after": retry, "per_second": limit.per_second, "burst": limit.burst},
            headers=[(b"retry-after", str(retry).encode())],
        )
