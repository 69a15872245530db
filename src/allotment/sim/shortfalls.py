"""The replay's shortfall tracker: when each queue was owed its guarantee and did not
get it.

After the cycles at each instant where the state changed, a queue the core reports
short of its guarantee (:meth:`Session.short_of_guarantee`) opens a shortfall, unless one
is open already; an open one closes at the first such instant the queue is no longer
short. At the end of the replay the open ones close at the last instant. Tracked only
with a :class:`Session` core.
"""

from __future__ import annotations

from allotment.scheduler.session import Session
from allotment.sim.results import Shortfall


class ShortfallTracker:
    """The guarantee shortfalls of a replay: ``shortfalls`` holds the closed ones, in the
    order they closed."""

    def __init__(self) -> None:
        self.shortfalls: list[Shortfall] = []
        self._owed: dict[str, float] = {}
        self._last_instant = 0.0

    def track(self, now: float, session: Session | None, *, last: bool = False) -> None:
        """Open and close the queues' guarantee shortfalls after the cycles at ``now``
        (``last``: the replay is over; close every open one). Nothing without a
        ``session``."""
        if session is None:
            return
        short = set() if last or not session.pending_count else set(session.short_of_guarantee())
        owed = self._owed
        for queue in short - owed.keys():
            owed[queue] = now
        for queue in list(owed.keys() - short):
            start = owed.pop(queue)
            end = self._last_instant if last else now
            self.shortfalls.append(Shortfall(queue=queue, start=start, end=end))
        self._last_instant = now
