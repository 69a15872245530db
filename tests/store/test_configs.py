from __future__ import annotations

import hashlib

from sqlalchemy.orm import Session, sessionmaker

from allotment.store.configs import apply_cluster_config, current_cluster_config

T0 = 1_700_000_000.0


def test_apply_versions_only_changes(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as session:
        assert current_cluster_config(session) is None
        first, written = apply_cluster_config(session, "pools: []\n", at=T0, applied_by="ops")
        assert written and first.version == 1
        assert first.sha256 == hashlib.sha256(b"pools: []\n").hexdigest()
    with sessions.begin() as session:
        again, written = apply_cluster_config(session, "pools: []\n", at=T0 + 1)
        assert not written and again.version == 1 and again.applied_at == T0
        second, written = apply_cluster_config(session, "pools: [a]\n", at=T0 + 2)
        assert written and second.version == 2
    with sessions() as session:
        latest = current_cluster_config(session)
        assert latest is not None
        assert (latest.version, latest.text, latest.applied_by) == (2, "pools: [a]\n", None)
