"""Group commit: many callers' small transactions written as one.

Each API request used to write in a transaction of its own (a submission, then its
audit record): one commit, one turn of the store's write lock each, so concurrent
requests queued behind each other's commits. :class:`GroupCommit` lets callers hand it
their writes instead. Whoever finds no group being written becomes the writer: it takes
every write waiting (its own included, in arrival order), runs them in one transaction
and commits once; the others wait for that commit and get their own results. A caller
returns only once its write is committed, as before.

When the group's transaction fails, each of its writes is run again alone, in a
transaction of its own, so that one bad write fails only its own caller (the writes
must therefore only write through the session they are given, so that a rollback
undoes them whole).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")

MAX_GROUP = 256
"""At most this many writes in one transaction (bounds the wait of the first)."""


@dataclass(eq=False)
class _Write(Generic[T]):
    work: Callable[[Session], T]
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class GroupCommit:
    """Writes through ``sessions``, grouped. Thread-safe; one per session factory."""

    def __init__(self, sessions: sessionmaker[Session], *, max_group: int = MAX_GROUP) -> None:
        self.sessions = sessions
        self.max_group = max_group
        self._cond = threading.Condition()
        self._waiting: list[_Write[Any]] = []
        self._writing = False
        self.groups = 0
        """Transactions committed for groups (read by tests and benchmarks)."""
        self.writes = 0
        """Writes committed."""

    def run(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` in a transaction, grouped with others' writes; return
        its result once committed, or raise what it raised."""
        mine: _Write[T] = _Write(work)
        with self._cond:
            self._waiting.append(mine)
        while True:
            with self._cond:
                while not mine.done and self._writing:
                    self._cond.wait()
                if mine.done:
                    return self._answer(mine)
                # Nobody writes and mine waits: write the oldest group (mine is in it
                # unless more than max_group wait before it: then go round again).
                self._writing = True
                group = self._waiting[: self.max_group]
                del self._waiting[: self.max_group]
            try:
                self._write(group)
            finally:
                with self._cond:
                    for write in group:
                        if not write.done:  # the writer itself was interrupted
                            write.error = RuntimeError("the group's writer was interrupted")
                            write.done = True
                    self._writing = False
                    self._cond.notify_all()

    @staticmethod
    def _answer(write: _Write[T]) -> T:
        if write.error is not None:
            raise write.error
        result: T = write.result
        return result

    def _write(self, group: list[_Write[Any]]) -> None:
        try:
            with self.sessions.begin() as session:
                results = [write.work(session) for write in group]
        except Exception as exc:
            if len(group) == 1:
                self._settle(group[0], error=exc)
            else:
                for write in group:
                    self._alone(write)
            return
        with self._cond:
            self.groups += 1
            for write, result in zip(group, results, strict=True):
                self._settle(write, result=result)

    def _alone(self, write: _Write[Any]) -> None:
        try:
            with self.sessions.begin() as session:
                result = write.work(session)
        except Exception as exc:  # handed to its caller
            self._settle(write, error=exc)
            return
        with self._cond:
            self.groups += 1
        self._settle(write, result=result)

    def _settle(
        self, write: _Write[Any], *, result: Any = None, error: Exception | None = None
    ) -> None:
        with self._cond:
            if error is None:
                self.writes += 1
            write.result, write.error, write.done = result, error, True
