from __future__ import annotations

from sqlalchemy import Engine, inspect

from allotment.store import migrate
from allotment.store.models import Base

TABLES = {
    "cluster_configs",
    "jobs",
    "attempts",
    "events",
    "api_tokens",
    "audit_records",
    "job_usage",
    "device_usage",
    "alerts",
    "leader_term",
    "idempotency_keys",
    "services",
}


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade(engine: Engine) -> None:
    assert migrate.current(engine) is None

    migrate.upgrade(engine)
    assert _tables(engine) == TABLES
    assert migrate.current(engine) == migrate.head()

    migrate.downgrade(engine, "base")
    assert _tables(engine) == set()
    assert migrate.current(engine) is None

    migrate.upgrade(engine)
    assert _tables(engine) == TABLES
    assert migrate.current(engine) == migrate.head()


def test_migrations_match_the_models(engine: Engine) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    migrate.upgrade(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_upgrade_by_url(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/by_url.db"
    migrate.upgrade(url)
    assert migrate.current(url) == migrate.head()
    migrate.downgrade(url, "base")
    assert migrate.current(url) is None
