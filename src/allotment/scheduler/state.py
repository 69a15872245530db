"""The mutable world of one cycle: free capacity, quota usage and who runs where.

Built from a :class:`Snapshot`; every what-if change (remove victims, add an admission)
goes through :meth:`CycleState.hold` / :meth:`CycleState.unhold`, which keep the placer
and the quota tree in step and are exact inverses, so searches undo instead of copying.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from allotment.domain.cluster import Cluster, Node, PriorityClass
from allotment.domain.resources import GPU, MILLI
from allotment.scheduler.placement import Placer
from allotment.scheduler.policy import compose
from allotment.scheduler.quota import QuotaTree
from allotment.scheduler.snapshot import ReplicaPlacement, RunningJob, SchedulerPolicy, Snapshot

if TYPE_CHECKING:
    from allotment.scheduler.verdicts import Verdict

FOREIGN = "foreign"
"""The group name of a device taken by something outside Allotment (:meth:`occupy`)."""

_LOWEST = PriorityClass(name="unknown", value=-1_000_000)


MAX_REMEMBERED = 65_536
"""Entries a session keeps in each of its memories across cycles (failed victim searches,
verdicts per pool, whether a request borrows), at most."""


@dataclass(slots=True, kw_only=True)
class Holder:
    """A job holding resources during the cycle: running before it, or admitted in it."""

    id: str
    queue: str
    pool: str
    klass: PriorityClass
    start_time: float
    end_bound: float | None
    placements: tuple[ReplicaPlacement, ...]
    total: dict[str, int]
    terminating: bool = False
    fresh: bool = False
    """Admitted in this cycle (never a victim in the same cycle)."""
    side: int | None = None
    """Which nodes it keeps to: the pool's owners' or its guests' (:meth:`CycleState.side`)."""
    preemptible: bool = False
    """A victim even where its class is not preemptible."""
    submit_time: float = 0.0
    """Its place in its queue's line (:func:`~allotment.scheduler.victims.covered`)."""


class CycleState:
    """Free capacity, quota usage and holders, kept consistent through one cycle.

    Built whole from a snapshot (:meth:`from_snapshot`), or kept across cycles by a
    :class:`~allotment.scheduler.session.Session`, which adds and removes running jobs
    as they come and go and calls :meth:`begin` before each cycle.
    """

    def __init__(
        self,
        cluster: Cluster,
        policy: SchedulerPolicy,
        nodes: Iterable[Node],
        *,
        now: float = 0.0,
    ) -> None:
        self.now = now
        self.cluster = cluster
        self.policy = policy
        self.rules = compose(policy)
        """The strategies of ``policy`` (:mod:`allotment.scheduler.policy`), resolved once."""
        self.placer = Placer(nodes)
        capacity: dict[str, dict[str, int]] = {pool: {} for pool in self.cluster.pools}
        capacity.update(self.placer.pool_capacity())
        self.quota = QuotaTree(self.cluster, capacity, limit=self.rules.quota.limit)
        self.holders: dict[str, Holder] = {}
        self.by_pool: dict[str, dict[str, Holder]] = {p: {} for p in self.quota.pools}
        self.terminating: dict[str, Holder] = {}
        self.known_end: dict[str, int] = {}
        """Per pool, how many holders have a known end (``end_bound``): where none has,
        a backfill plan has nothing to go on and the pool's jobs need not be looked at."""
        self.by_queue: dict[str, dict[str, dict[str, Holder]]] = {}
        """Holders per pool, then queue: where victim searches look."""
        self.borrow_only: dict[str, dict[str, Holder]] = {}
        """Holders of borrow-only classes per pool (victims for any queue)."""
        self.classes: dict[tuple[str, str], dict[str, tuple[PriorityClass, int]]] = {}
        """Per (pool, queue), the priority classes of its holders there, by name, each
        with how many hold: whether any of the queue's own jobs could be a victim."""
        self._fresh: list[Holder] = []
        self.changed: dict[str, int] = {}
        """Per pool, how many times its set of running jobs changed between cycles (a
        job started, ended or began stopping): what a victim search depends on."""
        self.released: dict[str, int] = {}
        """Per pool, how many times running jobs gave capacity back."""
        self.joined: dict[str, int] = {}
        """Per pool, how many running jobs became possible victims (admitted in an earlier
        cycle, or started elsewhere): the only way a victim search there finds more."""
        self.left: dict[tuple[str, str], int] = {}
        """Per (queue, pool), how many of the queue's running jobs there ended (its usage
        fell: it may take back more by reclaim)."""
        self.no_victims: dict[tuple[object, ...], int] = {}
        """Victim searches that failed without claims, with ``changed`` of their pool
        then: they fail again until it changes."""
        self.verdicts: dict[tuple[object, ...], dict[str, Verdict]] = {}
        """Per (queue, class value, shape), then per pool, why a try failed there with no
        claims and no victims taken. Only a cycle without explanations keeps them; how
        long one holds is :mod:`allotment.scheduler.verdicts`'s."""
        self.borrows: dict[tuple[object, ...], tuple[int, bool]] = {}
        """Per (queue, shape, pools), whether such a request would borrow wherever it may
        run, with the queue's ``guaranteed_version`` then (see the cycle's order keys)."""
        self.no_fit: dict[tuple[object, ...], tuple[int, Any]] = {}
        """Placements that failed without claims, with ``released`` of their pool then
        and the reason: they fail again until capacity comes back."""
        self.capacity_cache: dict[tuple[object, ...], Any] = {}
        """What depends on node capacities alone (which nodes a shape could ever fit),
        kept as long as the nodes are."""
        self.cycle_cache: dict[tuple[object, ...], Any] = {}
        """What one cycle works out from the running jobs of a pool (keyed by the pool's
        version), forgotten when the next cycle begins."""

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> CycleState:
        """The state at ``snapshot.now``: its nodes, with its running jobs held."""
        state = cls(snapshot.cluster, snapshot.policy, snapshot.node_list(), now=snapshot.now)
        # Quota usage is added per queue, pool and kind at once: the tree walk is the
        # costly part, and a queue has many jobs.
        usage: dict[tuple[str, str, bool], dict[str, int]] = {}
        for job in snapshot.running:
            holder = state._holder(job)
            state.holders[holder.id] = holder
            state.by_pool.setdefault(holder.pool, {})[holder.id] = holder
            state._index(holder)
            if holder.terminating:
                state.terminating[holder.id] = holder
            state.placer.allocate(holder.placements, holder.side)
            key = (holder.queue, holder.pool, holder.klass.borrow_only)
            bucket = usage.setdefault(key, {})
            for resource, amount in holder.total.items():
                bucket[resource] = bucket.get(resource, 0) + amount
        for (queue, pool, borrow_only), total in usage.items():
            if queue in state.cluster.queues and pool in state.by_pool:
                state.quota.add(queue, pool, total, borrow_only=borrow_only)
        return state

    def begin(self, now: float) -> None:
        """Start a new cycle at ``now``: last cycle's admissions become ordinary running
        jobs (possible victims), terminating jobs are expected gone at ``now``."""
        self.now = now
        self.cycle_cache.clear()
        for holder in self._fresh:
            holder.fresh = False
            self._bump(self.changed, holder.pool)
            self._bump(self.joined, holder.pool)
        self._fresh.clear()
        for holder in self.terminating.values():
            holder.end_bound = now

    def add_running(self, job: RunningJob) -> Holder:
        """Hold a running job's allocation (it must not be held already)."""
        if job.id in self.holders:
            raise ValueError(f"job {job.id} already holds resources")
        holder = self._holder(job)
        self.hold(holder)
        self._bump(self.changed, holder.pool)
        self._bump(self.joined, holder.pool)
        if holder.terminating:
            self.terminating[holder.id] = holder
        return holder

    def remove_running(self, job_id: str) -> Holder | None:
        """Release a running job's allocation; None if it held nothing."""
        holder = self.holders.get(job_id)
        if holder is None:
            return None
        self.unhold(holder)
        self.terminating.pop(job_id, None)
        self._bump(self.changed, holder.pool)
        self._bump(self.released, holder.pool)
        self._bump(self.left, (holder.queue, holder.pool))
        return holder

    def occupy(self, node: str, device: int) -> ReplicaPlacement | None:
        """Take one whole free device away from every job (something outside Allotment
        holds it); the placement that took it, or None when it was not free."""
        state = self.placer.nodes.get(node)
        if state is None or device >= len(state.device_free):
            return None
        if state.device_free[device] != MILLI:
            return None
        taken = ReplicaPlacement(
            group=FOREIGN, index=device, node=node, resources={GPU: MILLI}, devices=(device,)
        )
        self.placer.allocate([taken])
        self._bump(self.changed, state.pool)
        return taken

    def vacate(self, taken: ReplicaPlacement) -> None:
        """Give back a device :meth:`occupy` took."""
        state = self.placer.nodes.get(taken.node)
        self.placer.release([taken])
        if state is not None:
            self._bump(self.changed, state.pool)
            self._bump(self.released, state.pool)

    def mark_terminating(self, job_id: str) -> bool:
        """A running job is being stopped; it holds its resources until it is gone."""
        holder = self.holders.get(job_id)
        if holder is None:
            return False
        holder.terminating = True
        if holder.end_bound is None:
            self._bump(self.known_end, holder.pool)
        holder.end_bound = self.now
        self.terminating[job_id] = holder
        self._bump(self.changed, holder.pool)
        return True

    @staticmethod
    def _bump(counts: dict[Any, int], key: object) -> None:
        counts[key] = counts.get(key, 0) + 1

    def _index(self, holder: Holder) -> None:
        key = (holder.pool, holder.queue)
        queues = self.by_queue.get(holder.pool)
        if queues is None:
            queues = self.by_queue[holder.pool] = {}
        group = queues.get(holder.queue)
        if group is None:
            group = queues[holder.queue] = {}
        group[holder.id] = holder
        if holder.end_bound is not None:
            self._bump(self.known_end, holder.pool)
        klass = holder.klass
        counts = self.classes.get(key)
        if counts is None:
            counts = self.classes[key] = {}
        known = counts.get(klass.name)
        counts[klass.name] = (klass, 1 if known is None else known[1] + 1)
        if klass.borrow_only:
            self.borrow_only.setdefault(holder.pool, {})[holder.id] = holder

    def _unindex(self, holder: Holder) -> None:
        key = (holder.pool, holder.queue)
        del self.by_queue[holder.pool][holder.queue][holder.id]
        if holder.end_bound is not None:
            self.known_end[holder.pool] -= 1
        klass = holder.klass
        counts = self.classes[key]
        kept, held = counts[klass.name]
        if held > 1:
            counts[klass.name] = (kept, held - 1)
        else:
            del counts[klass.name]
        if klass.borrow_only:
            del self.borrow_only[holder.pool][holder.id]

    def queue_holders(self, pool: str, queue: str) -> Mapping[str, Holder]:
        return self.by_queue.get(pool, {}).get(queue, {})

    def side(self, queue: str, pool: str) -> int | None:
        """Whether ``queue``'s jobs are the pool's own (``OWNER``: the queue is guaranteed
        GPUs there) or borrowers reclaim may evict (``GUEST``); None where nobody is a
        guest. The quota rule decides (:meth:`.policy.QuotaRule.side`)."""
        return self.rules.quota.side(self, queue, pool)

    def klass(self, name: str) -> PriorityClass:
        return self.cluster.priority_classes.get(name, _LOWEST)

    def _holder(self, job: RunningJob) -> Holder:
        return Holder(
            id=job.id,
            queue=job.queue,
            pool=job.pool,
            klass=self.klass(job.priority_class),
            start_time=job.start_time,
            end_bound=self.now if job.terminating else job.end_bound,
            placements=job.placements,
            total=job.total(),
            terminating=job.terminating,
            side=self.side(job.queue, job.pool),
            preemptible=job.preemptible,
            submit_time=job.start_time if job.submit_time is None else job.submit_time,
        )

    def hold(self, holder: Holder) -> None:
        """Account a holder's resources on its nodes and in its queue's quota."""
        self.holders[holder.id] = holder
        self.by_pool.setdefault(holder.pool, {})[holder.id] = holder
        self._index(holder)
        self.placer.allocate(holder.placements, holder.side)
        if holder.queue in self.cluster.queues and holder.pool in self.by_pool:
            self.quota.add(
                holder.queue, holder.pool, holder.total, borrow_only=holder.klass.borrow_only
            )

    def unhold(self, holder: Holder) -> None:
        """Exactly undo :meth:`hold`."""
        del self.holders[holder.id]
        del self.by_pool[holder.pool][holder.id]
        self._unindex(holder)
        self.placer.release(holder.placements, holder.side)
        if holder.queue in self.cluster.queues and holder.pool in self.by_pool:
            self.quota.remove(
                holder.queue, holder.pool, holder.total, borrow_only=holder.klass.borrow_only
            )

    def new_holder(
        self,
        *,
        job_id: str,
        queue: str,
        pool: str,
        klass: PriorityClass,
        placements: tuple[ReplicaPlacement, ...],
        total: Mapping[str, int],
        runtime: float | None,
        submit_time: float,
    ) -> Holder:
        holder = Holder(
            id=job_id,
            queue=queue,
            pool=pool,
            klass=klass,
            start_time=self.now,
            end_bound=None if runtime is None else self.now + runtime,
            placements=placements,
            total=dict(total),
            fresh=True,
            side=self.side(queue, pool),
            submit_time=submit_time,
        )
        self._fresh.append(holder)
        return holder
