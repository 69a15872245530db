"""The costly parts of the dashboard's live pages, computed once for all their viewers:
a queue's line (:func:`allotment.api.explain.queue_line`: a snapshot of the store, one
scheduling cycle and the start estimates) and who borrows from whom across the fleet
(:func:`fleet_loans`, :mod:`allotment.scheduler.lending` on the quota tree of a
snapshot), which the queue pages and the overview share. :class:`JobService` holds one
:class:`SharedViews` of each (``queue_line``, ``fleet_loans``).

The live parts reload every two seconds in every open browser, so :class:`SharedViews`
keeps one answer per name:

* it is used again as long as the *state mark* it was computed at stands — the
  cluster's version (:attr:`~allotment.control.cluster_state.ClusterState.version`:
  a new configuration, or new nodes) and the store's newest event id
  (:func:`~allotment.store.views.last_event_id`: every submission, move and new reason
  writes an event) — and for at most :data:`VIEW_TTL_S`, which bounds what the mark
  does not see: what time alone changes (a ``not_before`` reached, an estimate), an
  attempt's replicas ending after its job already left, and, on PostgreSQL, an event
  committed after one with a higher id was read;
* one thread computes a queue's answer while the others asking for the same queue
  wait for it (one lock per queue), so N viewers cost one computation per change;
* the answer is the same for everyone. Each viewer's access to the queue is checked
  before it is read, and :func:`page_loans` hides afterwards the queue names that
  viewer may not see. The line holds only the queue's own jobs, which whoever may
  read the queue may read.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session as DbSession

from allotment.domain.cluster import Cluster
from allotment.domain.resources import MILLI
from allotment.scheduler.lending import UNASSIGNED, Loan, loans_now
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.store.views import snapshot_from_store

VIEW_TTL_S = 2.0
"""The longest a queue's answer is used again while the state mark stands."""

ANOTHER_TENANT = "another tenant"
PLATFORM_QUEUE = "a platform queue"

T = TypeVar("T")


class SharedViews(Generic[T]):
    """One answer per name, shared by every thread asking for it; thread-safe. With
    ``max_names``, only the answers for that many names are kept, those asked last."""

    def __init__(
        self,
        *,
        ttl_s: float = VIEW_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        max_names: int | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_names = max_names
        self._clock = clock
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._held: dict[str, tuple[Hashable, float, T]] = {}

    def get(self, name: str, mark: Hashable, compute: Callable[[], T]) -> T:
        """The answer for ``name`` computed at ``mark`` less than ``ttl_s`` ago, or a new
        one from ``compute``, which runs in one thread at a time per name: the others
        wait for its answer. An error reaches only the caller whose ``compute`` raised
        it; the next caller computes again."""
        with self._lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            with self._lock:
                held = self._held.pop(name, None)
                if held is not None:
                    self._held[name] = held  # to the end: the latest asked
            if held is not None and held[0] == mark and self._clock() - held[1] < self.ttl_s:
                return held[2]
            at = self._clock()
            value = compute()
            with self._lock:
                self._held.pop(name, None)
                self._held[name] = (mark, at, value)
                while self.max_names is not None and len(self._held) > self.max_names:
                    oldest = next(iter(self._held))
                    del self._held[oldest]
                    self._locks.pop(oldest, None)
            return value


Line = list[dict[str, object]]
"""A queue's line: its waiting jobs in order, with reason, position and estimated start."""


def fleet_loans(
    db: DbSession, cluster: Cluster, *, now: float, policy: SchedulerPolicy | None
) -> tuple[Loan, ...]:
    """Every loan of the fleet, from a snapshot of the store at ``now``, unscoped."""
    return tuple(loans_now(snapshot_from_store(db, cluster, now=now, policy=policy)))


@dataclass(frozen=True, slots=True)
class PageLoans:
    """What a queue's page shows of the loans: rows of ``pool``, ``queue`` (a name, or
    a stand-in for one the viewer may not see), ``kind`` and ``gpu``."""

    borrows: list[dict[str, Any]]
    """Whose unused quota the queue's subtree uses."""
    lends: list[dict[str, Any]]
    """Who uses the unused quota of the queue's subtree."""
    split: bool
    """Some borrower here borrows from more than one lender in a pool: its GPUs are
    split among them by their share of the unused quota."""


def page_loans(
    loans: Sequence[Loan], cluster: Cluster, queue: str, tenant: str | None
) -> PageLoans:
    """The loans between ``queue``'s subtree and the rest, in GPUs per pool, as a
    principal narrowed to ``tenant`` may see them (``None``: everything): a queue of
    another tenant is :data:`ANOTHER_TENANT`, a queue of the platform that is none of
    the tenant's queues' ancestors :data:`PLATFORM_QUEUE`."""
    inside = {q.name for q in cluster.queues.values() if queue in q.path}
    lenders: dict[tuple[str, str], set[str]] = defaultdict(set)
    for loan in loans:
        lenders[(loan.borrower, loan.pool)].add(loan.lender)
    label = _labeller(cluster, tenant)
    borrows: dict[tuple[str, str, str, bool], float] = defaultdict(float)
    lends: dict[tuple[str, str, str, bool], float] = defaultdict(float)
    split = False
    for loan in loans:
        if (loan.borrower in inside) == (loan.lender in inside):
            continue  # within the subtree, or elsewhere
        split = split or len(lenders[(loan.borrower, loan.pool)]) > 1
        if loan.borrower in inside:
            borrows[(loan.pool, *label(loan.lender, True))] += loan.amount
        else:
            lends[(loan.pool, *label(loan.borrower, False))] += loan.amount
    return PageLoans(borrows=_rows(borrows), lends=_rows(lends), split=split)


def _labeller(cluster: Cluster, tenant: str | None) -> Callable[[str, bool], tuple[str, str, bool]]:
    """``(name or stand-in, kind, readable)`` of a queue as ``tenant`` may see it:
    ``kind`` is ``queue``, ``unassigned`` (an inner queue's quota not given to its
    children) or ``pool`` (the pool's capacity given to no queue); ``readable``: the
    viewer may open the queue's page."""
    shown: set[str] | None = None
    if tenant is not None:
        shown = set()
        for q in cluster.queues.values():
            if q.tenant == tenant:
                shown.update((q.name, *(a.name for a in q.ancestors())))

    def label(name: str, lender: bool) -> tuple[str, str, bool]:
        if lender and name == UNASSIGNED:
            return "", "pool", False
        found = cluster.queues.get(name)
        kind = "unassigned" if lender and found is not None and not found.is_leaf else "queue"
        if shown is None:
            return name, kind, found is not None
        if name in shown:
            return name, kind, found is not None and found.tenant == tenant
        owned = found is not None and found.tenant is not None
        return (ANOTHER_TENANT if owned or found is None else PLATFORM_QUEUE), kind, False

    return label


def _rows(amounts: dict[tuple[str, str, str, bool], float]) -> list[dict[str, Any]]:
    """One row per pool and (shown) queue, in GPUs to two decimals, largest first."""
    gpus = {key: round(milli / MILLI, 2) for key, milli in amounts.items()}
    order = sorted((k for k, v in gpus.items() if v > 0), key=lambda k: (k[0], -gpus[k], k[1]))
    return [
        {
            "pool": pool,
            "queue": name,
            "kind": kind,
            "link": link,
            "gpu": gpus[pool, name, kind, link],
        }
        for pool, name, kind, link in order
    ]
