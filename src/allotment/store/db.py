"""Engines and sessions from a database URL.

``sqlite:///path/to/allotment.db`` (the default) or ``postgresql+psycopg://user@host/db``.
SQLite connections get WAL journaling, enforced foreign keys and a busy timeout, so a
reader never blocks the writer and a second writer waits instead of failing at once.
Within one process, writers to a SQLite engine also take turns in arrival order
(:class:`WriteGate`): SQLite's own busy wait polls, and a thread that writes back to back
(the control loop) would otherwise starve the API's writers past the busy timeout.
"""

from __future__ import annotations

import threading
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


class WriteGate:
    """A first-come, first-served lock held from a connection's first write to the end of
    its transaction; re-entrant per thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # next ticket to hand out
        self._serving = 0  # ticket allowed in
        self._owner: int | None = None
        self._depth = 0

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._cond.wait()
            self._owner = me
            self._depth = 1

    def release(self) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._serving += 1
                self._cond.notify_all()


_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
_GATE_HELD = "allotment_write_gate"


def _gate_sqlite_writes(engine: Engine) -> WriteGate:
    gate = WriteGate()

    def before(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not conn.info.get(_GATE_HELD) and statement.lstrip()[:7].upper().startswith(_WRITES):
            gate.acquire()
            conn.info[_GATE_HELD] = True

    def end(conn: Any, *_args: Any) -> None:
        if conn.info.pop(_GATE_HELD, False):
            gate.release()

    def end_dbapi(dbapi_connection: Any, connection_record: Any, reset_state: Any) -> None:
        record = connection_record
        if record.info.pop(_GATE_HELD, False):  # returned to the pool mid-transaction
            gate.release()

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "commit", end)
    event.listen(engine, "rollback", end)
    event.listen(engine.pool, "reset", end_dbapi)
    return gate


def make_engine(url: str = DEFAULT_URL, *, echo: bool = False, **kwargs: Any) -> Engine:
    """Create an engine for ``url``; extra keyword arguments go to ``create_engine``.

    Does not connect. Raises ``sqlalchemy.exc.ArgumentError`` for a malformed URL.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, echo=echo, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        _gate_sqlite_writes(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, echo=echo, **kwargs)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
