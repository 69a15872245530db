"""One scheduler leads: a lock held for as long as this process runs the control loop,
and the election that starts a loop runner whenever this process takes the lock.

Several API servers may share one PostgreSQL store, but only the holder of the leader
lock runs the control loop. On PostgreSQL the lock is a session-level advisory lock
(``pg_try_advisory_lock`` on a fixed key) held on a dedicated connection, so it is
released when the holder releases it or when its connection or process dies. On SQLite
it is an exclusive ``flock`` on ``<database file>.leader`` next to the database file,
released likewise when the process dies; an in-memory SQLite database belongs to one
process, which always leads.

:class:`LeaderElection` runs the loop only while holding the lock: the servers that do
not hold it try again every ``poll_s`` and take over when the leader goes away (its
process ends, or on PostgreSQL its connection dies); a leader whose lock is lost stops
its runner at once.

Usage of the lock alone::

    leadership = acquire_leadership(engine)
    if leadership is None:
        ...  # another server leads; serve the API only, try again later
    with leadership:
        ...  # run the control loop
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from allotment.control.runner import LoopRunner

log = logging.getLogger(__name__)

LEADER_LOCK_KEY = 0x616C6C6F746D6E74
"""The PostgreSQL advisory lock key (``b"allotmnt"`` as a 64-bit integer)."""

LOCK_SUFFIX = ".leader"
DEFAULT_POLL_S = 2.0


class Leadership:
    """The leader lock, held until :meth:`release` (idempotent) or the ``with`` block
    ends. ``where`` says what is locked (for logs)."""

    def __init__(
        self,
        where: str,
        release: Callable[[], None],
        check: Callable[[], bool] | None = None,
    ) -> None:
        self.where = where
        self._release: Callable[[], None] | None = release
        self._check = check

    @property
    def held(self) -> bool:
        """Whether :meth:`release` has not been called yet."""
        return self._release is not None

    def check(self) -> bool:
        """Whether the lock is still held: released, or (PostgreSQL) the connection
        holding it is gone, answer ``False``; the caller must then stop leading."""
        if self._release is None:
            return False
        return self._check() if self._check is not None else True

    def release(self) -> None:
        """Give the lock up; later calls do nothing."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Leadership:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Leadership({self.where!r}, held={self.held})"


def acquire_leadership(engine: Engine, *, key: int = LEADER_LOCK_KEY) -> Leadership | None:
    """Take the leader lock of ``engine``'s database without waiting; ``None`` when
    another holder has it. ``key`` is the PostgreSQL advisory lock key (tests pass their
    own). Raises ``ValueError`` for a backend other than SQLite and PostgreSQL, and lets
    connection errors (``sqlalchemy.exc.OperationalError``, ``OSError``) through."""
    backend = engine.url.get_backend_name()
    if backend == "postgresql":
        return _postgres(engine, key)
    if backend == "sqlite":
        return _sqlite(engine)
    raise ValueError(f"no leader lock for the {backend!r} database backend")


def _postgres(engine: Engine, key: int) -> Leadership | None:
    connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        got = connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key})
        held = bool(got.scalar())
    except BaseException:
        connection.close()
        raise
    if not held:
        connection.close()
        return None

    def release() -> None:
        try:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
        except SQLAlchemyError:
            connection.invalidate()  # closing its server session frees the lock
        finally:
            connection.close()

    def check() -> bool:
        return _alive(connection)

    return Leadership(f"postgresql advisory lock {key}", release, check)


def _alive(connection: Connection) -> bool:
    try:
        connection.execute(text("SELECT 1"))
    except SQLAlchemyError:
        return False
    return True


def _sqlite(engine: Engine) -> Leadership | None:
    database = engine.url.database
    if not database or database == ":memory:" or engine.url.query.get("mode") == "memory":
        return Leadership("in-memory sqlite", lambda: None)
    path = Path(database)
    lock_path = path.with_name(path.name + LOCK_SUFFIX)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())

    def release() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    return Leadership(f"flock {lock_path}", release)


class LeaderElection:
    """Start a runner from ``make_runner`` whenever this process becomes the leader.

    ``make_runner`` is called once per leadership term (a runner starts only once).
    ``on_change(leading)`` is told of every change. :meth:`start` tries at once, so a
    process that finds the lock free leads before :meth:`start` returns.
    """

    def __init__(
        self,
        engine: Engine,
        make_runner: Callable[[], LoopRunner],
        *,
        poll_s: float = DEFAULT_POLL_S,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.engine = engine
        self.make_runner = make_runner
        self.poll_s = poll_s
        self.on_change = on_change
        self.runner: LoopRunner | None = None
        self._leadership: Leadership | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def leading(self) -> bool:
        return self.runner is not None

    def wake(self) -> None:
        """Wake the runner, if this process leads. Never blocks."""
        runner = self.runner
        if runner is not None:
            runner.wake()

    def start(self) -> None:
        self._step()
        self._thread = threading.Thread(target=self._run, name="allotment-leader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the runner (replicas keep running) and give the lock up."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            self._step_down()

    def _run(self) -> None:
        while not self._stopping.wait(self.poll_s):
            try:
                self._step()
            except Exception:  # the store may be briefly unreachable: try again later
                log.exception("leader election step failed")

    def _step(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            if self._leadership is not None:
                fenced = self.runner is not None and self.runner.fenced
                if self._leadership.check() and not fenced:
                    return
                why = "another server took over" if fenced else "lost the leader lock"
                log.warning("%s (%s): stopping the scheduler", why, self._leadership)
                self._step_down()
                return
            leadership = acquire_leadership(self.engine)
            if leadership is None:
                return
            self._leadership = leadership
            self.runner = self.make_runner()
            self.runner.start()
            log.info("leading the scheduler (%s)", leadership.where)
        if self.on_change is not None:
            self.on_change(True)

    def _step_down(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.stop()
        leadership, self._leadership = self._leadership, None
        if leadership is not None:
            leadership.release()
            if self.on_change is not None:
                self.on_change(False)
