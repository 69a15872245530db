"""Issuing, listing and revoking API tokens, without HTTP.

The caller's right to each is checked by :mod:`allotment.api.policy` before anything is
read or written. A token's text is returned once, by :meth:`TokenService.issue`; the
store keeps only its digest.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from allotment.api import schemas
from allotment.api.auth import Principal, new_token, token_digest
from allotment.api.policy import RANK, Action, Owned, require, visible_tenant
from allotment.domain.cluster import Cluster
from allotment.domain.durations import parse_duration
from allotment.domain.errors import InvalidInput, NotFound
from allotment.domain.tenancy import Role
from allotment.domain.text import check_plain
from allotment.store import tokens as token_store
from allotment.store.models import ApiToken

PLATFORM = "(platform)"
"""How a token without a tenant names its owner in errors."""


def token_out(row: ApiToken) -> schemas.TokenOut:
    return schemas.TokenOut(
        id=row.id,
        user=row.user,
        tenant=row.tenant,
        role=row.role,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        created_by=row.created_by,
    )


def _owned(row: ApiToken) -> Owned:
    return Owned(kind="token", name=row.id, tenant=row.tenant, user=row.user)


class TokenService:
    """Tokens of one store, checked against the cluster's tenants and members."""

    def __init__(
        self,
        *,
        cluster: Callable[[], Cluster],
        sessions: sessionmaker[Session],
        clock: Callable[[], float],
        on_revoke: Callable[[], None] = lambda: None,
    ) -> None:
        self.cluster = cluster
        self.sessions = sessions
        self.clock = clock
        self.on_revoke = on_revoke
        """Called after a token was revoked (the authenticator forgets what it remembers)."""

    def issue(self, principal: Principal, request: schemas.TokenCreate) -> schemas.TokenIssued:
        """A new token for ``request.user`` in ``request.tenant``. The role defaults to
        the user's role among the tenant's members (else ``member``); a tenant that
        lists members only issues tokens to them, at most at their role. Raises
        ``NotFound`` (another tenant's or no such tenant), ``Forbidden`` or
        ``InvalidInput``."""
        check_plain(request.user, name="user")
        if request.tenant is not None:
            check_plain(request.tenant, name="tenant")
        tenant = request.tenant
        require(
            principal,
            Action.TOKEN_MANAGE,
            Owned(kind="tenant", name=tenant or PLATFORM, tenant=tenant),
        )
        role = self._role(request, tenant)
        expires_at = None
        if request.expires_in is not None:
            seconds = parse_duration(request.expires_in, name="expires_in")
            if seconds <= 0:
                raise InvalidInput("expires_in must be positive", fields={"expires_in": 0})
            expires_at = self.clock() + seconds
        token = new_token()
        with self.sessions.begin() as db:
            row = token_store.create_token(
                db,
                digest=token_digest(token),
                user=request.user,
                tenant=tenant,
                role=role.value,
                created_by=principal.user,
                at=self.clock(),
                expires_at=expires_at,
            )
            return schemas.TokenIssued(**token_out(row).model_dump(), token=token)

    def _role(self, request: schemas.TokenCreate, tenant: str | None) -> Role:
        asked = Role(request.role) if request.role is not None else None
        if tenant is None:
            if asked not in (None, Role.ADMIN):
                raise InvalidInput(
                    f"a {asked} token needs a tenant: name one with --tenant",
                    fields={"role": request.role},
                )
            return Role.ADMIN
        found = self.cluster().tenants.get(tenant)
        if found is None:
            raise NotFound("tenant", tenant)
        declared = {m.user: m.role for m in found.members}
        if declared and request.user not in declared:
            raise InvalidInput(
                f"{request.user} is not a member of tenant {tenant}: add them under "
                f"tenants.{tenant}.members in the cluster file first",
                fields={"user": request.user, "tenant": tenant},
            )
        most = declared.get(request.user, Role.ADMIN)
        role = asked or declared.get(request.user, Role.MEMBER)
        if RANK[role] > RANK[most]:
            raise InvalidInput(
                f"{request.user} is {most.value} in tenant {tenant}; a token cannot be "
                f"{role.value}",
                fields={"user": request.user, "role": role.value, "member_role": most.value},
            )
        return role

    def list(self, principal: Principal) -> schemas.TokenList:
        """Tokens the principal may manage: all (platform admin) or its tenant's."""
        require(principal, Action.TOKEN_READ)
        with self.sessions() as db:
            rows = token_store.list_tokens(db, tenant=visible_tenant(principal))
            return schemas.TokenList(tokens=[token_out(r) for r in rows])

    def revoke(self, principal: Principal, token_id: str) -> schemas.TokenOut:
        """Revoke a token (again: no change); return it. Raises ``NotFound``, ``Forbidden``."""
        with self.sessions.begin() as db:
            row = token_store.get_token(db, token_id)
            require(principal, Action.TOKEN_MANAGE, _owned(row))
            out = token_out(token_store.revoke_token(db, token_id, at=self.clock()))
        self.on_revoke()
        return out
