"""Run the store's Alembic migrations from code; no ``alembic.ini`` is needed.

``target`` is a database URL or an ``Engine`` (tests pass an engine whose connections
use their own PostgreSQL schema). Each call blocks until the migration is committed.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from allotment.store.db import make_engine

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(url: str | None = None) -> Config:
    """An Alembic ``Config`` pointing at the packaged migrations (and ``url``, if given)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _run(target: str | Engine, action: str, revision: str) -> None:
    engine = make_engine(target) if isinstance(target, str) else target
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            if action == "upgrade":
                command.upgrade(config, revision)
            else:
                command.downgrade(config, revision)
    finally:
        if isinstance(target, str):
            engine.dispose()


def upgrade(target: str | Engine, revision: str = "head") -> None:
    """Migrate the database at ``target`` up to ``revision`` (the newest by default)."""
    _run(target, "upgrade", revision)


def downgrade(target: str | Engine, revision: str) -> None:
    """Migrate the database at ``target`` down to ``revision`` (``"base"`` drops all)."""
    _run(target, "downgrade", revision)


def head() -> str | None:
    """The newest revision the packaged migrations define."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current(target: str | Engine) -> str | None:
    """The revision the database at ``target`` is at; ``None`` when never migrated."""
    engine = make_engine(target) if isinstance(target, str) else target
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        if isinstance(target, str):
            engine.dispose()
