"""The API token repository. Tokens are kept only as digests (see
:func:`allotment.api.auth.token_digest`); the token text is never stored.

Every function takes a ``Session`` and flushes but never commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from allotment.domain.errors import NotFound
from allotment.store.models import ApiToken


def new_token_id() -> str:
    """A fresh token id: ``t-`` and 16 hex digits (not secret: it names the token)."""
    return f"t-{uuid.uuid4().hex[:16]}"


def create_token(
    session: Session,
    *,
    digest: str,
    user: str,
    tenant: str | None,
    role: str,
    created_by: str,
    at: float,
    expires_at: float | None = None,
    token_id: str | None = None,
) -> ApiToken:
    """Insert a token row; return it."""
    row = ApiToken(
        id=token_id or new_token_id(),
        user=user,
        tenant=tenant,
        role=role,
        created_at=at,
        expires_at=expires_at,
        revoked_at=None,
        digest=digest,
        created_by=created_by,
    )
    session.add(row)
    session.flush()
    return row


def token_by_digest(session: Session, digest: str) -> ApiToken | None:
    """The token whose digest is ``digest``, or ``None``."""
    return session.scalars(select(ApiToken).where(ApiToken.digest == digest)).one_or_none()


def get_token(session: Session, token_id: str) -> ApiToken:
    """The token ``token_id``; raises :class:`NotFound`."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound("token", token_id)
    return row


def list_tokens(session: Session, *, tenant: str | None = None) -> Sequence[ApiToken]:
    """Tokens oldest first; only ``tenant``'s when given (filtered in the query)."""
    query = select(ApiToken)
    if tenant is not None:
        query = query.where(ApiToken.tenant == tenant)
    return session.scalars(query.order_by(ApiToken.created_at, ApiToken.id)).all()


def revoke_token(session: Session, token_id: str, *, at: float) -> ApiToken:
    """Revoke ``token_id`` (a no-op when it already is); return it. Raises ``NotFound``."""
    row = get_token(session, token_id)
    if row.revoked_at is None:
        row.revoked_at = at
        session.flush()
    return row
