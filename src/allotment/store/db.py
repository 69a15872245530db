"""Engines and sessions from a database URL.

``sqlite:///path/to/allotment.db`` (the default) or ``postgresql+psycopg://user@host/db``.
SQLite connections get WAL journaling, enforced foreign keys and a busy timeout, so a
reader never blocks the writer and a second writer waits instead of failing at once.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

DEFAULT_URL = "sqlite:///allotment.db"

SQLITE_BUSY_TIMEOUT_MS = 10_000


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def make_engine(url: str = DEFAULT_URL, *, echo: bool = False, **kwargs: Any) -> Engine:
    """Create an engine for ``url``; extra keyword arguments go to ``create_engine``.

    Does not connect. Raises ``sqlalchemy.exc.ArgumentError`` for a malformed URL.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, echo=echo, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, echo=echo, **kwargs)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
