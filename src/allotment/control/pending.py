"""Which jobs joined or left ``pending`` since the control loop's last turn.

Every change of a job's state writes a ``transition`` event (:mod:`allotment.store.jobs`),
and the events' ids only grow. So instead of reading the id of every pending job on
every turn (a cost proportional to the backlog), the loop reads the events written since
the newest one it has seen (its *mark*) and looks only at the jobs whose moves entered
or left ``pending``.

Ids are not always committed in order. SQLite serialises writers, so a reader never sees
an id while a lower one is still to come. PostgreSQL takes ids from a sequence when a
row is inserted, not when its transaction commits: a reader may see id 101 committed
while 100 is still in flight, and must not move its mark past 100 for good. Each id
below the mark that was not there when it was passed is therefore remembered as a *gap*
and asked for again on the following turns, for :data:`GAP_KEEP_S` (a gap may also be
an id that will never come: a rolled-back insert). On top of that, a full read of the
pending ids every :data:`RESYNC_S` is the safety net: a transaction that commits after
its gap was given up (or one in flight when the loop started, below the trailing window
read then, or past :data:`MAX_GAPS`) is seen at the latest by the next full read. A
lost job would wait forever, so the full read stays, only rarer.

Membership of ``pending`` is ``Job.state``, written only with a transition event whose
``from_state`` or ``to_state`` is ``pending``; reasons, notices and other moves are
skipped without reading their jobs.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from allotment.domain.lifecycle import JobState
from allotment.store.jobs import IN_CHUNK, TRANSITION
from allotment.store.models import Event, Job

RESYNC_S = 30.0
"""Seconds between two full reads of the pending ids (the safety net)."""

GAP_KEEP_S = 30.0
"""Seconds an id missing below the mark is asked for again before it is given up."""

MAX_GAPS = 10_000
"""More missing ids than this at once (a jump of the sequence): a full read instead."""

TRAIL = 1_000
"""Ids read below the newest at a restart, so that those still in flight are gaps."""

_PENDING = JobState.PENDING.value


class PendingFeed:
    """The loop's mark in the events and its gaps. :meth:`restart` when the scheduler
    session is rebuilt from the store; then :meth:`changes` at each turn."""

    def __init__(self, *, resync_s: float = RESYNC_S, gap_keep_s: float = GAP_KEEP_S) -> None:
        self.resync_s = resync_s
        self.gap_keep_s = gap_keep_s
        self.mark = 0
        """The newest event id seen."""
        self.gaps: dict[int, float] = {}
        """Ids below the mark not seen yet, with when each was first missed."""
        self._resync_at = float("-inf")
        self.full_reads = 0
        """Turns that read every pending id (restarts excluded)."""
        self.incremental_reads = 0

    def restart(self, db: DbSession, now: float) -> None:
        """Start from the newest event, before the caller reads the whole store: what
        commits later with a higher id is read at the next turn, the ids missing among
        the last :data:`TRAIL` are gaps."""
        ids = list(db.scalars(select(Event.id).order_by(Event.id.desc()).limit(TRAIL)))
        self.mark = ids[0] if ids else 0
        low = ids[-1] if ids else 0
        present = set(ids)
        self.gaps = {i: now for i in range(low + 1, self.mark) if i not in present}
        self._resync_at = now + self.resync_s

    def changes(self, db: DbSession, now: float) -> set[str] | None:
        """The jobs whose membership of ``pending`` may have changed since the last
        call (their rows are to be read again), or ``None`` when every pending id is to
        be read: every :attr:`resync_s`, and when too many ids are missing."""
        self.gaps = {i: t for i, t in self.gaps.items() if now - t < self.gap_keep_s}
        columns = (Event.id, Event.job_id, Event.kind, Event.from_state, Event.to_state)
        rows = list(db.execute(select(*columns).where(Event.id > self.mark)).tuples())
        gaps = sorted(self.gaps)
        for start in range(0, len(gaps), IN_CHUNK):
            chunk = gaps[start : start + IN_CHUNK]
            rows.extend(db.execute(select(*columns).where(Event.id.in_(chunk))).tuples())
        seen = {row[0] for row in rows}
        for event_id in seen.intersection(self.gaps):
            del self.gaps[event_id]
        top = max(seen, default=self.mark)
        full = now >= self._resync_at
        if top > self.mark:
            missing = [i for i in range(self.mark + 1, top) if i not in seen]
            if len(missing) + len(self.gaps) > MAX_GAPS:
                full = True
                self.gaps.clear()
            else:
                self.gaps.update(dict.fromkeys(missing, now))
            self.mark = top
        if full:
            self._resync_at = now + self.resync_s
            self.full_reads += 1
            return None
        self.incremental_reads += 1
        return {
            job_id
            for _id, job_id, kind, source, target in rows
            if job_id is not None
            and kind == TRANSITION
            and (source == _PENDING or target == _PENDING)
        }


def pending_ids(db: DbSession, among: Collection[str] | None = None) -> set[str]:
    """The ids of the pending jobs (among ``among`` only, when given: one query per
    :data:`~allotment.store.jobs.IN_CHUNK` of them)."""
    query = select(Job.id).where(Job.state == _PENDING)
    if among is None:
        return set(db.scalars(query))
    wanted = sorted(among)
    found: set[str] = set()
    for start in range(0, len(wanted), IN_CHUNK):
        found.update(db.scalars(query.where(Job.id.in_(wanted[start : start + IN_CHUNK]))))
    return found
