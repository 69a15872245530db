"""Applied versions of ``cluster.yaml``: the text as written, its hash, when and by whom.

Functions take a ``Session`` and flush but never commit.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from allotment.store.models import ClusterConfig


def current_cluster_config(session: Session) -> ClusterConfig | None:
    """The newest applied version, or ``None`` before the first apply."""
    return session.scalars(
        select(ClusterConfig).order_by(ClusterConfig.version.desc()).limit(1)
    ).one_or_none()


def apply_cluster_config(
    session: Session, text: str, *, at: float, applied_by: str | None = None
) -> tuple[ClusterConfig, bool]:
    """Store ``text`` as the next version unless it equals the current one.

    Returns the current version and whether a new one was written. The caller validates
    the text first; this only records it. Two concurrent applies of different texts
    collide on the version key: the later commit fails and may be retried.
    """
    digest = hashlib.sha256(text.encode()).hexdigest()
    latest = current_cluster_config(session)
    if latest is not None and latest.sha256 == digest:
        return latest, False
    version = (session.scalar(select(func.max(ClusterConfig.version))) or 0) + 1
    config = ClusterConfig(
        version=version, text=text, sha256=digest, applied_at=at, applied_by=applied_by
    )
    session.add(config)
    session.flush()
    return config, True
