"""Fencing: a deposed leader can never write a decision.

Leadership itself is a lock (:mod:`allotment.control.leader`), and a lock can be lost
without its holder knowing at once (a PostgreSQL connection terminated, a process
paused): for a moment two servers may believe they lead. So each new leader raises the
term in ``leader_term`` (:func:`take_term`), and every transaction of its control loop
first proves, in that very transaction, that the term is still its own
(:func:`fence`): a transaction of a deposed leader fails with :class:`Fenced` before it
reads or writes anything, so it can neither admit, nor launch, nor free anything.

On PostgreSQL the proof reads the row ``FOR SHARE``: a new leader's raise of the term
(``FOR UPDATE``) waits for the old leader's transactions in flight, and every later one
sees the new term. On SQLite writers are serialised by the database itself: a
transaction that read the old term cannot commit a write after the raise.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from allotment.store.models import LeaderTerm

ROW = 1


class Fenced(RuntimeError):
    """This server's leadership term is over: another server leads now."""

    def __init__(self, term: int, current: int | None) -> None:
        super().__init__(
            f"leadership term {term} is over (the current term is {current}): another "
            "server leads now; this one stops scheduling"
        )
        self.term = term
        self.current = current


def take_term(sessions: sessionmaker[Session], *, holder: str, at: float) -> int:
    """Raise the term and return it: the caller (which holds the leader lock) leads
    from now on under this term."""
    with sessions.begin() as db:
        row = db.get(LeaderTerm, ROW, with_for_update=True)
        if row is None:
            row = LeaderTerm(id=ROW, term=1, holder=holder[:256], since=at)
            db.add(row)
        else:
            row.term += 1
            row.holder = holder[:256]
            row.since = at
        db.flush()
        return int(row.term)


def current_term(sessions: sessionmaker[Session]) -> int | None:
    """The current term (``None`` before any leader took one)."""
    with sessions() as db:
        return db.scalar(select(LeaderTerm.term).where(LeaderTerm.id == ROW))


def fence(sessions: sessionmaker[Session], term: int) -> sessionmaker[Session]:
    """Make every transaction of ``sessions`` (a factory of the leader's own) first
    prove ``term``; one that cannot raises :class:`Fenced`. Returns ``sessions``."""

    def prove(_session: Session, _transaction: Any, connection: Any) -> None:
        query = select(LeaderTerm.term).where(LeaderTerm.id == ROW)
        if connection.dialect.name == "postgresql":
            query = query.with_for_update(read=True)
        current = connection.execute(query).scalar()
        if current != term:
            raise Fenced(term, current)

    event.listen(sessions, "after_begin", prove)
    return sessions
