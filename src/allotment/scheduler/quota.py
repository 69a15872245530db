"""The hierarchical quota tree: nominal quota, borrowing and lending.

Per pool and resource, every queue has a *usage* (its subtree's jobs) and a *demand*
``D``: for a leaf its usage, for an inner queue the sum of its children's *occupancy*
``occ(c) = max(D(c), reserved(c))``, where ``reserved(c)`` is the part of ``c``'s nominal
quota it does not lend (``nominal - lending_limit``). The virtual root's nominal is the
pool's capacity. A request fits when, at every level of its path,

* ``D(q) + Δ <= nominal(q) + borrowing_limit(q)`` where a borrowing limit is set, and
* the root's demand stays within the pool's capacity.

So idle guaranteed quota flows to siblings via the parent, a lending limit keeps part of
it back, and a queue above its nominal is *borrowing* and may be reclaimed. Quotas limit
only the resources they name; unnamed resources are limited by the pool's capacity.
A queue's own limit at its level of the tree comes from the policy's quota rule
(:class:`~allotment.scheduler.policy.QuotaRule`): with borrowing, ``nominal +
borrowing_limit`` where a borrowing limit is set; isolated, a leaf may use at most the
nominal it names, and nothing of a pool where it names nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Set

from allotment.domain.cluster import Cluster, Queue
from allotment.domain.reasons import Reason, ReasonCode
from allotment.domain.resources import to_units
from allotment.scheduler.snapshot import PendingJob

ROOT = ""
"""The virtual root of every pool's tree: the pool's own capacity."""
_NONE: frozenset[str] = frozenset()

Amounts = dict[str, int]
_NOTHING: Amounts = {}
"""Nothing claimed (read only)."""


class QuotaCheck:
    """The answer to "may this queue take this much more in this pool?" (kept and shared
    while the pool's usage is the same: never changed once made). A plain class, not a
    dataclass: the quota is checked for most tries, and compiled (see the package), a
    plain class is built without running Python code."""

    __slots__ = (
        "blocking_queue",
        "borrowable",
        "borrowed",
        "fits",
        "nominal",
        "requested",
        "resource",
        "used",
    )

    def __init__(
        self,
        *,
        fits: bool,
        borrowed: Amounts | None = None,
        blocking_queue: str | None = None,
        resource: str | None = None,
        requested: int = 0,
        used: int = 0,
        nominal: int | None = None,
        borrowable: int = 0,
    ) -> None:
        self.fits = fits
        self.borrowed: Amounts = {} if borrowed is None else borrowed
        """Milli-units of the request above the leaf's unused nominal quota."""
        self.blocking_queue = blocking_queue
        """The level that said no (``ROOT`` for the pool's capacity)."""
        self.resource = resource
        self.requested = requested
        self.used = used
        self.nominal = nominal
        self.borrowable = borrowable

    def detail(self, pool: str) -> dict[str, object]:
        return {
            "queue": self.blocking_queue or "cluster",
            "pool": pool,
            "resource": self.resource,
            "requested": _units(self.requested),
            "used": _units(self.used),
            "nominal": None if self.nominal is None else _units(self.nominal),
            "borrowable": _units(self.borrowable),
        }

    def reason(self, pool: str, leaf: str) -> Reason:
        """Why ``leaf`` may not take it (``quota_exhausted``), for a job's waiting reason."""
        return Reason(ReasonCode.QUOTA_EXHAUSTED, self.message(pool, leaf), self.detail(pool))

    def message(self, pool: str, leaf: str) -> str:
        res = self.resource or "?"
        req = _units(self.requested)
        if self.blocking_queue == ROOT:
            return (
                f"pool {pool} is full for queue {leaf}: {req} {res} requested, "
                f"{_units(self.used)} of {_units(self.nominal or 0)} in use across all queues"
            )
        nominal = "no" if self.nominal is None else f"{_units(self.nominal)}"
        where = f"queue {self.blocking_queue}"
        if self.blocking_queue != leaf:
            where = f"queue {leaf} (limit set by {self.blocking_queue})"
        return (
            f"{where}: {req} {res} requested in pool {pool}, {_units(self.used)} of "
            f"{nominal} nominal used, {_units(self.borrowable)} borrowable"
        )


def _units(milli: int) -> float | int:
    value = to_units(milli)
    return int(value) if value == int(value) else value


class QuotaTree:
    """Usage and limits of the whole queue tree for every pool; mutable, with what-if
    changes undone by :meth:`remove` (the exact inverse of :meth:`add`). ``limit``
    gives a queue's own limit in a pool (``{}``: none; ``{"*": 0}``: nothing at all)."""

    def __init__(
        self,
        cluster: Cluster,
        capacity: Mapping[str, Mapping[str, int]],
        *,
        limit: Callable[[Queue, str], Amounts],
    ) -> None:
        self.pools = list(capacity)
        self._parent: dict[str, str] = {}
        self._chain: dict[str, tuple[str, ...]] = {}
        self._down: dict[str, tuple[str, ...]] = {}
        """Per queue, its ancestors from the top down, then itself (``ROOT`` left out)."""
        self._children: dict[str, list[str]] = {ROOT: [q.name for q in cluster.roots]}
        self._weight: dict[str, float] = {}
        self._nominal: dict[tuple[str, str], Amounts] = {}
        self._limit: dict[tuple[str, str], Amounts] = {}
        self._reserved: dict[tuple[str, str], Amounts] = {}
        self._usage: dict[tuple[str, str], Amounts] = {}
        self._demand: dict[tuple[str, str], Amounts] = {}
        self._guaranteed: dict[tuple[str, str], Amounts] = {}
        self._named: dict[str, set[str]] = {}
        """Per queue, the pools where its nominal quota names something (it is within
        its nominal quota nowhere else)."""
        self._checked: dict[str, dict[tuple[str, str], QuotaCheck]] = {}
        """Per pool, the answers of :meth:`check` since its usage last changed: a full
        fleet asks the same question of the same queue many times."""
        self._shares: dict[str, float] = {}
        """:meth:`dominant_share` per queue, since its usage last changed."""
        self.guaranteed_version: dict[str, int] = {}
        """Per leaf, how many times its guaranteed usage changed (whether a request is
        within its nominal quota anywhere can only change then)."""
        self._claimed: dict[tuple[str, str], Amounts] = {}
        """Per leaf and pool, what its jobs that preempt to start there ask, while they
        wait for their victims (:meth:`claim`): part of its guaranteed usage for
        :meth:`within_nominal`, so that two of its jobs do not each take back the same
        unused guarantee."""
        for pool, cap in capacity.items():
            self._nominal[(ROOT, pool)] = dict(cap)
            self._usage[(ROOT, pool)] = {}
            self._demand[(ROOT, pool)] = {}
        for queue in cluster.queues.values():
            self._add_queue(queue, limit)
        for (name, pool), reserved in self._reserved.items():
            for resource, keep in reserved.items():
                self._propagate(self._chain[name][1:], pool, resource, keep)

    def _add_queue(self, queue: Queue, limit: Callable[[Queue, str], Amounts]) -> None:
        name = queue.name
        self._parent[name] = queue.parent.name if queue.parent is not None else ROOT
        self._chain[name] = (name, *(a.name for a in queue.ancestors()), ROOT)
        self._down[name] = self._chain[name][-2::-1]
        self._children[name] = [c.name for c in queue.children]
        self._weight[name] = queue.spec.weight
        lend = queue.spec.lending_limit or {}
        for pool in self.pools:
            key = (name, pool)
            nominal = queue.nominal.get(pool)
            named = nominal.as_dict() if nominal is not None else {}
            self._nominal[key] = named
            if named:
                self._named.setdefault(name, set()).add(pool)
            self._limit[key] = limit(queue, pool)
            reserved: Amounts = {}
            if pool in lend:
                for r, amount in lend[pool].items():
                    keep = named.get(r, 0) - amount
                    if keep > 0:
                        reserved[r] = keep
            self._reserved[key] = reserved
            self._usage[key] = {}
            self._demand[key] = {}
            self._guaranteed[key] = {}

    # ----------------------------------------------------------------- reading

    def nominal(self, queue: str, pool: str) -> Amounts:
        return self._nominal.get((queue, pool), {})

    def usage(self, queue: str, pool: str) -> Amounts:
        return self._usage.get((queue, pool), {})

    def chain(self, queue: str) -> tuple[str, ...]:
        """The queue, its ancestors, then ``ROOT``."""
        return self._chain[queue]

    def children(self, queue: str) -> list[str]:
        """The queue's children (``ROOT``'s: the root queues)."""
        return self._children.get(queue, [])

    def lendable(self, queue: str, pool: str, resource: str) -> int:
        """How much of its nominal quota of ``resource`` the queue's subtree leaves
        unused for others now: nominal less its occupancy (its demand, or the part its
        lending limit keeps back when larger); 0 where it names none."""
        key = (queue, pool)
        nominal = self._nominal.get(key, {}).get(resource, 0)
        if nominal <= 0:
            return 0
        demand = self._demand[key].get(resource, 0)
        keep = self._reserved[key].get(resource, 0) if queue != ROOT else 0
        return max(0, nominal - max(demand, keep))

    def headroom(self, queue: str, pool: str, resource: str) -> tuple[int, str]:
        """The most of ``resource`` that ``queue`` may still take in ``pool``, and the
        level that limits it (``ROOT``: the pool's capacity)."""
        demand_of, reserved_of, limit_of = self._demand, self._reserved, self._limit
        root = (ROOT, pool)
        best = self._nominal[root].get(resource, 0) - demand_of[root].get(resource, 0)
        binder = ROOT
        for name in self._down[queue]:
            key = (name, pool)
            demand = demand_of[key].get(resource, 0)
            slack_free = reserved_of[key].get(resource, 0) - demand
            if slack_free > 0:
                best += slack_free
            limit = limit_of[key]
            if limit:
                own = 0 if "*" in limit else limit.get(resource)
                # On a tie the pool's capacity binds: a quota as large as the pool
                # limits nothing the pool does not.
                if own is not None and own - demand < best:
                    best = own - demand
                    binder = name
        return best, binder

    def check(self, queue: str, pool: str, job: PendingJob) -> QuotaCheck:
        """Whether ``queue`` may add ``job`` (all its replicas) in ``pool``, with the
        borrowed part or the resource and level that say no. The answer is remembered
        under the job's shape until the pool's usage changes."""
        known = self._checked.get(pool)
        if known is None:
            known = self._checked[pool] = {}
        key = (queue, job.shape())
        answer = known.get(key)
        if answer is None:
            answer = known[key] = self._check(queue, pool, job.total())
        return answer

    def _check(self, queue: str, pool: str, request: Mapping[str, int]) -> QuotaCheck:
        borrowed: Amounts = {}
        key = (queue, pool)
        usage = self._usage[key]
        nominal = self._nominal[key]
        for resource, amount in request.items():
            if amount <= 0:
                continue
            room, binder = self.headroom(queue, pool, resource)
            if amount > room:
                own = nominal.get(resource)
                if (
                    binder == ROOT
                    and own is not None
                    and own < self._nominal[(ROOT, pool)].get(resource, 0)
                    and usage.get(resource, 0) + amount > own
                ):
                    # It needs to borrow and the pool has nothing left to lend: the
                    # queue's own quota is what it has run out of.
                    binder = queue
                bkey = (binder, pool)
                bnominal = self._nominal[bkey].get(resource)
                own_nominal = nominal.get(resource, 0)
                return QuotaCheck(
                    fits=False,
                    blocking_queue=binder,
                    resource=resource,
                    requested=amount,
                    used=(self._demand if binder == ROOT else self._usage)[bkey].get(resource, 0),
                    nominal=bnominal,
                    borrowable=max(0, room - max(0, own_nominal - usage.get(resource, 0))),
                )
            if resource in nominal:
                before = max(0, usage.get(resource, 0) - nominal[resource])
                after = max(0, usage.get(resource, 0) + amount - nominal[resource])
                if after > before:
                    borrowed[resource] = after - before
        return QuotaCheck(fits=True, borrowed=borrowed)

    def lenders(self, queue: str, pool: str, borrowed: Mapping[str, int]) -> tuple[str, ...]:
        """Who lends the borrowed part: at the nearest ancestor whose subtree is within
        its nominal, the sibling subtrees with unused nominal quota (or the ancestor's
        unassigned quota, or the cluster's unassigned capacity)."""
        if not borrowed:
            return ()
        resource = next(iter(borrowed))
        chain = self._chain[queue]
        for child, parent in itertools.pairwise(chain):
            key = (parent, pool)
            if parent != ROOT:
                nominal = self._nominal[key].get(resource)
                if nominal is None or self._demand[key].get(resource, 0) > nominal:
                    continue
            idle = [
                s
                for s in self._children[parent]
                if s != child
                and self._usage[(s, pool)].get(resource, 0)
                < self._nominal[(s, pool)].get(resource, 0)
            ]
            return tuple(idle) if idle else (parent or "cluster",)
        return ("cluster",)

    def is_borrowing(
        self, queue: str, pool: str, *, releasing: Mapping[str, int] | None = None
    ) -> bool:
        """Whether the queue uses more than its nominal quota of any named resource (or
        anything of a pool where it names nothing), not counting ``releasing``: what its
        jobs already on their way out (terminating, or victims chosen this cycle) hold."""
        key = (queue, pool)
        usage = self._usage[key]
        if releasing:
            usage = {r: v - releasing.get(r, 0) for r, v in usage.items()}
        nominal = self._nominal[key]
        if not nominal:
            return any(usage.values())
        return any(usage.get(r, 0) > n for r, n in nominal.items())

    def named_pools(self, queue: str) -> Set[str]:
        """The pools where ``queue``'s nominal quota names something: the only ones where
        :meth:`within_nominal` can be true."""
        return self._named.get(queue, _NONE)

    def within_nominal(self, queue: str, pool: str, request: Mapping[str, int]) -> bool:
        """Whether the queue's guaranteed usage (borrow-only jobs excluded, its waiting
        preemptors' :meth:`claim` included) plus ``request`` stays within its nominal
        quota: the condition for reclaiming."""
        key = (queue, pool)
        nominal = self._nominal[key]
        if not nominal:
            return False
        guaranteed = self._guaranteed[key]
        claimed = self._claimed.get(key, _NOTHING) if self._claimed else _NOTHING
        return all(
            guaranteed.get(r, 0) + claimed.get(r, 0) + amount <= nominal[r]
            for r, amount in request.items()
            if amount > 0 and r in nominal
        )

    def lent_out(self, queue: str, pool: str, adding: Mapping[str, int] | None = None) -> bool:
        """Whether other queues hold part of ``queue``'s guarantee in ``pool``: of some
        resource it is guaranteed, the rest of the pool uses more than the pool has
        beyond that guarantee (with ``adding``: once another queue's job that asks so
        much is admitted there too)."""
        nominal = self._nominal.get((queue, pool))
        if not nominal:
            return False
        mine = self._usage[(queue, pool)]
        everyone = self._usage[(ROOT, pool)]
        capacity = self._nominal[(ROOT, pool)]
        more = adding or {}
        return any(
            everyone.get(r, 0) + more.get(r, 0) - mine.get(r, 0) > capacity.get(r, 0) - amount
            for r, amount in nominal.items()
            if amount > 0
        )

    def dominant_share(self, queue: str) -> float:
        """max over pools and named resources of usage / nominal, divided by weight; a
        queue with usage but no nominal quota ranks above every guaranteed share."""
        known = self._shares.get(queue)
        if known is None:
            known = self._shares[queue] = self._dominant_share(queue)
        return known

    def _dominant_share(self, queue: str) -> float:
        share = 0.0
        for pool in self.pools:
            key = (queue, pool)
            usage = self._usage[key]
            if not usage:
                continue
            nominal = self._nominal[key]
            for resource, used in usage.items():
                quota = nominal.get(resource)
                if quota:
                    share = max(share, used / quota)
                elif used and resource in nominal:
                    share = max(share, 1.0 + used / 1e6)
            if not nominal and any(usage.values()):
                share = max(share, 1.0 + sum(usage.values()) / 1e12)
        return share / self._weight.get(queue, 1.0)

    # ----------------------------------------------------------------- writing

    def claim(self, queue: str, pool: str, request: Mapping[str, int]) -> None:
        """A job of ``queue`` preempts to start in ``pool`` asking ``request`` (less what
        its own queue's victims give up, when known; while they stop, a victim of its
        own queue still counts too, which errs towards taking back less): until
        :meth:`drop_claims`, it counts as the queue's guaranteed usage there
        (:meth:`within_nominal`), as it will once it starts. Only that: the pool's
        usage, and so what others may use or borrow, is as before (its victims still
        hold their resources)."""
        claimed = self._claimed.setdefault((queue, pool), {})
        for resource, amount in request.items():
            claimed[resource] = claimed.get(resource, 0) + amount
        self.guaranteed_version[queue] = self.guaranteed_version.get(queue, 0) + 1

    def drop_claims(self) -> None:
        """Forget every :meth:`claim` (at the end of a cycle: the next one claims again
        for the preemptors still waiting)."""
        for queue, _ in self._claimed:
            self.guaranteed_version[queue] = self.guaranteed_version.get(queue, 0) + 1
        self._claimed.clear()

    def add(
        self, queue: str, pool: str, request: Mapping[str, int], *, borrow_only: bool = False
    ) -> None:
        """Account ``request`` to ``queue`` and its ancestors."""
        self._apply(queue, pool, request, 1, borrow_only)

    def remove(
        self, queue: str, pool: str, request: Mapping[str, int], *, borrow_only: bool = False
    ) -> None:
        """Exactly undo :meth:`add`."""
        self._apply(queue, pool, request, -1, borrow_only)

    def _apply(
        self, queue: str, pool: str, request: Mapping[str, int], sign: int, borrow_only: bool
    ) -> None:
        chain = self._chain[queue]
        self._checked.pop(pool, None)
        for name in chain:
            self._shares.pop(name, None)
        if not borrow_only:
            self.guaranteed_version[queue] = self.guaranteed_version.get(queue, 0) + 1
            guaranteed = self._guaranteed[(queue, pool)]
            for resource, amount in request.items():
                guaranteed[resource] = guaranteed.get(resource, 0) + sign * amount
        for resource, amount in request.items():
            if not amount:
                continue
            delta = sign * amount
            for name in chain:
                usage = self._usage[(name, pool)]
                usage[resource] = usage.get(resource, 0) + delta
            self._propagate(chain, pool, resource, delta)

    def _propagate(self, chain: tuple[str, ...], pool: str, resource: str, change: int) -> None:
        """Add ``change`` to the demand of ``chain[0]`` and pass the change in its
        occupancy on up to the root."""
        for name in chain:
            if not change:
                return
            key = (name, pool)
            demand = self._demand[key]
            old = demand.get(resource, 0)
            new = old + change
            demand[resource] = new
            if name == ROOT:
                return
            keep = self._reserved[key].get(resource, 0)
            change = max(new, keep) - max(old, keep)
