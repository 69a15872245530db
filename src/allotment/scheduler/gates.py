"""Gates: what keeps a job from being tried at all, before quota and placement.

An unknown or disallowed priority class, fractional GPUs above one, a retry back-off, no
open pool, a job larger than the queue's ``max_job`` or ``max_job_replicas``, than any
node, or than the queue's quota could ever allow (what that quota is, the policy's quota
rule says: :meth:`~allotment.scheduler.policy.QuotaRule.ceiling`). A gated job waits
with its reason and does not hold up its queue.
"""

from __future__ import annotations

from collections.abc import Mapping

from allotment.domain.cluster import PriorityClass, Queue
from allotment.domain.durations import format_duration
from allotment.domain.reasons import Reason, ReasonCode
from allotment.domain.resources import GPU, MILLI, format_quantity
from allotment.scheduler.snapshot import PendingJob
from allotment.scheduler.state import CycleState


def shape_of(resources: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """A hashable form of a resource request, for per-cycle caches."""
    return tuple(sorted(resources.items()))


def _slots(capacity: Mapping[str, int], request: Mapping[str, int]) -> int:
    """How many replicas of ``request`` an empty node of ``capacity`` holds."""
    most: int | None = None
    for key, amount in request.items():
        if amount <= 0:
            continue
        if key == GPU and amount < MILLI:  # a share of one device, several per device
            fit = (MILLI // amount) * (capacity.get(GPU, 0) // MILLI)
        else:
            fit = capacity.get(key, 0) // amount
        most = fit if most is None else min(most, fit)
    return 1_000_000 if most is None else most


class Gates:
    """The gate checks of one cycle, with what they learn about node sizes cached."""

    def __init__(self, state: CycleState) -> None:
        self.state = state
        self._ever = state.capacity_cache

    def check(
        self, job: PendingJob, queue: Queue, open_pools: list[str]
    ) -> tuple[Reason | None, PriorityClass | None, list[str]]:
        """Why the job cannot be tried at all (bad class, back-off, no open pool, too big
        for the queue or for any node), else its class and the pools to try. Without a
        back-off the answer depends on the request and the configuration alone (the pools
        open to a queue included): it is kept as long as the nodes are, but for an invalid
        job (whose reason names its replica group)."""
        if job.not_before is not None:
            return self._check(job, queue, open_pools)
        key = ("gate", queue.name, job.priority_class, job.shape(), job.pools)
        known: tuple[Reason | None, PriorityClass | None, list[str]] | None = self._ever.get(key)
        if known is None:
            known = self._check(job, queue, open_pools)
            if known[0] is None or known[0].code is not ReasonCode.INVALID:
                self._ever[key] = known
        return known

    def _check(
        self, job: PendingJob, queue: Queue, open_pools: list[str]
    ) -> tuple[Reason | None, PriorityClass | None, list[str]]:
        cluster = self.state.cluster
        klass = cluster.priority_classes.get(job.priority_class)
        if klass is None or (
            queue.spec.priority_classes is not None
            and job.priority_class not in queue.spec.priority_classes
        ):
            allowed = queue.spec.priority_classes or sorted(cluster.priority_classes)
            return (
                Reason(
                    ReasonCode.INVALID,
                    f"priority class {job.priority_class!r} is not allowed in queue "
                    f"{queue.name}; allowed: {', '.join(allowed)}",
                    {"queue": queue.name, "priority_class": job.priority_class},
                ),
                None,
                [],
            )
        for group in job.replicas:
            gpu = group.resources.get(GPU, 0)
            if gpu > MILLI and gpu % MILLI:
                return (
                    Reason(
                        ReasonCode.INVALID,
                        f"replica group {group.name} asks for {format_quantity(GPU, gpu)} "
                        "GPUs; above one GPU, ask for whole GPUs",
                        {"group": group.name},
                    ),
                    klass,
                    [],
                )
        if job.not_before is not None and job.not_before > self.state.now:
            return (
                Reason(
                    ReasonCode.BACKOFF,
                    f"retry back-off: eligible in "
                    f"{format_duration(job.not_before - self.state.now)}",
                    {"not_before": job.not_before},
                ),
                klass,
                [],
            )
        pools = [p for p in job.pools if p in open_pools] if job.pools else open_pools
        if not pools:
            asked = ", ".join(job.pools) or "any"
            return (
                Reason(
                    ReasonCode.POOL_NOT_ALLOWED,
                    f"none of the pools asked for ({asked}) is open to queue {queue.name};"
                    f" open pools: {', '.join(open_pools) or 'none'}",
                    {"queue": queue.name, "pools": list(job.pools), "allowed": open_pools},
                ),
                klass,
                [],
            )
        most = queue.max_job_replicas
        if job.replica_count > most:
            return (
                Reason(
                    ReasonCode.EXCEEDS_QUEUE_LIMIT,
                    f"queue {queue.name} accepts jobs of up to {most:,} replicas; this job "
                    f"has {job.replica_count:,}",
                    {"queue": queue.name, "max_job_replicas": most},
                ),
                klass,
                [],
            )
        total = job.total()
        limit = queue.spec.max_job
        if limit is not None and not all(total.get(k, 0) <= limit[k] for k in limit):
            over = {
                k: format_quantity(k, total.get(k, 0)) for k in limit if total.get(k, 0) > limit[k]
            }
            return (
                Reason(
                    ReasonCode.EXCEEDS_QUEUE_LIMIT,
                    f"queue {queue.name} accepts jobs up to "
                    f"{', '.join(f'{v} {k}' for k, v in limit.display().items())}; "
                    f"this job asks for {', '.join(f'{v} {k}' for k, v in over.items())}",
                    {"queue": queue.name, "max_job": limit.display(), "requested": over},
                ),
                klass,
                [],
            )
        key = (tuple(pools), job.shape())
        fitting = self._ever.get(key)
        if fitting is None:
            fitting = self._ever[key] = [
                p
                for p in pools
                if all(self.ever_fits(p, g.resources) for g in job.replicas)
                and (job.replica_count == 1 or self.ever_placed(p, job))
            ]
        if not fitting:
            return (
                Reason(
                    ReasonCode.NO_NODE_FITS,
                    f"pool(s) {', '.join(pools)} could not hold this job even when "
                    "empty: no node is large enough for one replica, or the replicas do "
                    "not all fit at once",
                    {"pools": pools, "permanent": True},
                ),
                klass,
                [],
            )
        ceiling = self.state.rules.quota.ceiling(queue, fitting, total)
        if ceiling is not None:
            return ceiling, klass, []
        return None, klass, fitting

    def ever_fits(self, pool: str, request: Mapping[str, int]) -> bool:
        """Whether some node of ``pool`` could hold ``request`` when empty (cached)."""
        key = (pool, shape_of(request))
        known = self._ever.get(key)
        if known is None:
            known = self._ever[key] = self.state.placer.ever_fits(pool, request)
        return known

    def ever_placed(self, pool: str, job: PendingJob) -> bool:
        """Whether all of the job's replicas could be placed at once in ``pool`` when
        it is empty (cached: it depends on node sizes only)."""
        key = ("empty", pool, job.shape())
        known = self._ever.get(key)
        if known is None and len(job.replicas) == 1:
            # Identical replicas: count how many each empty node could hold.
            group = job.replicas[0]
            slots = 0
            for node in self.state.placer.by_pool.get(pool, ()):
                if node.suits(group.resources):
                    slots += _slots(node.capacity, group.resources)
                if slots >= group.count:
                    break
            known = self._ever[key] = slots >= group.count
        if known is None:
            empty = self._ever.get(("empty", pool))
            if empty is None:
                empty = self._ever[("empty", pool)] = self.state.placer.empty(pool)
            known = self._ever[key] = empty.place(pool, job.replicas).ok
        return bool(known)
