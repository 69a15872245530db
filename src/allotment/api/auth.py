"""Authentication: who a request speaks for, behind one small interface.

An :class:`Authenticator` turns the token a request presents into a :class:`Principal`
(user, tenant, role), or ``None`` when the token is not one it knows; it raises
:class:`~allotment.domain.errors.Unauthenticated` when it knows the token but the token
no longer counts (expired, revoked). Implementations here: the store's API tokens
(:class:`StoreTokens`), the admin token ``allot up`` writes for the local user
(:class:`AdminDigest`), and :class:`FirstOf` to try several in order. An OIDC/JWT
verifier would be one more implementation.

Tokens are high-entropy random strings; only their SHA-256 is stored, and digests are
compared in constant time. A store token found valid is remembered for
:data:`TOKEN_CACHE_S` (a request then needs no store read to authenticate); revoking a
token through this server forgets every remembered one at once (:meth:`StoreTokens.forget`),
so a revoked token can pass only on another server, and only for that long. Expiry is
checked on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from allotment.domain.errors import Unauthenticated
from allotment.domain.tenancy import Role
from allotment.store.tokens import token_by_digest

TOKEN_CACHE_S = 2.0
"""How long a store token found valid is remembered."""
TOKEN_CACHE_SIZE = 10_000
"""Most tokens remembered at once (the least recently used are forgotten first)."""

TOKEN_PREFIX = "allot_"
TOKEN_BYTES = 32


def token_digest(token: str) -> str:
    """The stored form of a token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh token: ``allot_`` and 32 random bytes, URL-safe base64."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who a request speaks for. ``tenant`` is ``None`` for the platform; a principal
    with role ``admin`` and no tenant is a platform admin. ``token_id`` names the
    stored token (``None`` for the admin token of ``allot up`` and for anonymous)."""

    user: str
    tenant: str | None
    role: Role
    token_id: str | None = None

    @property
    def platform_admin(self) -> bool:
        return self.tenant is None and self.role is Role.ADMIN


ANONYMOUS = Principal(user="anonymous", tenant=None, role=Role.ADMIN, token_id=None)
"""Every request of an app built without an authenticator (tests, embedding)."""


class Authenticator(Protocol):
    """Turns a presented token into a principal."""

    def authenticate(self, token: str) -> Principal | None:
        """The principal of ``token``; ``None`` when the token is unknown here. Raises
        ``Unauthenticated`` for a known token that no longer counts. May block on I/O."""
        ...


class AdminDigest:
    """The one admin token of ``allot up``, known by its digest: a platform admin."""

    def __init__(self, digest: str, *, user: str) -> None:
        self.digest = digest
        self.user = user

    def authenticate(self, token: str) -> Principal | None:
        if hmac.compare_digest(token_digest(token), self.digest):
            return Principal(user=self.user, tenant=None, role=Role.ADMIN, token_id=None)
        return None

    def answer_now(self, token: str) -> tuple[bool, Principal | None]:
        return True, self.authenticate(token)  # no I/O: always known at once


class StoreTokens:
    """The API tokens in the store (see :mod:`allotment.store.tokens`)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        clock: Callable[[], float],
        cache_s: float = TOKEN_CACHE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.cache_s = cache_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._known: OrderedDict[str, tuple[float, Principal, float | None]] = OrderedDict()
        """digest -> (when found valid, its principal, when it expires)."""

    def authenticate(self, token: str) -> Principal | None:
        digest = token_digest(token)
        found = self._remembered(digest)
        if found is not None:
            return found
        principal, expires_at = self._read(digest)
        if principal is not None and self.cache_s > 0:
            with self._lock:
                self._known[digest] = (self._monotonic(), principal, expires_at)
                self._known.move_to_end(digest)
                while len(self._known) > TOKEN_CACHE_SIZE:
                    self._known.popitem(last=False)
        return principal

    def answer_now(self, token: str) -> tuple[bool, Principal | None]:
        found = self._remembered(token_digest(token))
        return found is not None, found

    def forget(self) -> None:
        """Forget every token remembered (a token was revoked)."""
        with self._lock:
            self._known.clear()

    def _remembered(self, digest: str) -> Principal | None:
        with self._lock:
            hit = self._known.get(digest)
            if hit is None:
                return None
            found_at, principal, expires_at = hit
            if self._monotonic() - found_at >= self.cache_s or (
                expires_at is not None and expires_at <= self.clock()
            ):
                del self._known[digest]  # read it again: it may have expired or been revoked
                return None
            self._known.move_to_end(digest)
            return principal

    def _read(self, digest: str) -> tuple[Principal | None, float | None]:
        with self.sessions() as db:
            row = token_by_digest(db, digest)
            if row is None or not hmac.compare_digest(row.digest, digest):
                return None, None
            if row.revoked_at is not None:
                raise Unauthenticated("revoked", f"the token {row.id} has been revoked")
            if row.expires_at is not None and row.expires_at <= self.clock():
                raise Unauthenticated("expired", f"the token {row.id} has expired")
            principal = Principal(
                user=row.user, tenant=row.tenant, role=Role(row.role), token_id=row.id
            )
            return principal, row.expires_at


class FirstOf:
    """Several authenticators, asked in order; the first that knows the token answers."""

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self.authenticators = tuple(authenticators)

    def authenticate(self, token: str) -> Principal | None:
        for authenticator in self.authenticators:
            found = authenticator.authenticate(token)
            if found is not None:
                return found
        return None

    def answer_now(self, token: str) -> tuple[bool, Principal | None]:
        for authenticator in self.authenticators:
            done, found = _answer_now(authenticator, token)
            if not done or found is not None:
                return done, found
        return True, None

    def forget(self) -> None:
        for authenticator in self.authenticators:
            forget_tokens(authenticator)


def forget_tokens(authenticator: Authenticator | None) -> None:
    """Have ``authenticator`` forget the tokens it remembers, if it remembers any."""
    forget = getattr(authenticator, "forget", None)
    if callable(forget):
        forget()


def _answer_now(authenticator: Authenticator, token: str) -> tuple[bool, Principal | None]:
    answer_now = getattr(authenticator, "answer_now", None)
    if not callable(answer_now):
        return False, None
    done, found = answer_now(token)
    return bool(done), found


def authenticate_now(authenticator: Authenticator | None, token: str | None) -> Principal | None:
    """:func:`authenticate`, where the answer needs no I/O (no authenticator, no token,
    a token the authenticator remembers or checks in memory); ``None`` where it does:
    then call :func:`authenticate` off the event loop. An authenticator answers at once
    through an optional ``answer_now(token)`` method: ``(True, principal or None)`` when
    it knows its answer without I/O, ``(False, None)`` when it must look."""
    if authenticator is None or token is None:
        return authenticate(authenticator, token)
    done, found = _answer_now(authenticator, token)
    if not done:
        return None
    if found is None:
        raise Unauthenticated("invalid", "the token is not valid")
    return found


def authenticate(authenticator: Authenticator | None, token: str | None) -> Principal:
    """The principal of a request that presented ``token`` (``None``: none was sent).
    Without an authenticator every request is :data:`ANONYMOUS`. Raises
    ``Unauthenticated`` saying why (missing, invalid, expired, revoked)."""
    if authenticator is None:
        return ANONYMOUS
    if token is None:
        raise Unauthenticated("missing", "no token was sent")
    found = authenticator.authenticate(token)
    if found is None:
        raise Unauthenticated("invalid", "the token is not valid")
    return found
