"""The fleet as the API shows it: queue usage, pools and nodes, from the open attempts."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy.orm import Session as DbSession

from allotment.api import schemas
from allotment.api.explain import gpus, natural
from allotment.domain.cluster import Cluster, Queue
from allotment.domain.resources import GPU
from allotment.store.allocations import placements_from_json
from allotment.store.layout import replica_name
from allotment.store.views import open_attempts, pending_rows


def _amounts(milli: dict[str, int]) -> dict[str, float | int]:
    """Milli-units as natural units (GPUs, cores, bytes); ints when whole."""
    return {key: natural(value) for key, value in sorted(milli.items())}


class Usage:
    """What the open attempts hold, read once: per (queue, pool) and per node.

    The totals count every job; ``node_jobs`` lists only ``jobs_of``'s jobs when given.
    ``count_pending=False`` skips reading the pending jobs (``pending`` stays empty)."""

    def __init__(
        self, db: DbSession, *, jobs_of: str | None = None, count_pending: bool = True
    ) -> None:
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.borrowed: dict[tuple[str, str], int] = defaultdict(int)
        self.running: dict[str, int] = defaultdict(int)
        self.pending: dict[str, int] = defaultdict(int)
        self.on_node: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.node_jobs: dict[str, list[schemas.NodeJob]] = defaultdict(list)
        for job, attempt in open_attempts(db):
            pool = attempt.pool or ""
            self.running[job.queue] += 1
            self.borrowed[(job.queue, pool)] += int((attempt.borrowed or {}).get(GPU, 0))
            for placement in placements_from_json(attempt.allocation):
                gpu = placement.resources.get(GPU, 0)
                self.used[(job.queue, pool)] += gpu
                for key, amount in placement.resources.items():
                    self.on_node[placement.node][key] += amount
                if jobs_of is not None and job.tenant != jobs_of:
                    continue
                self.node_jobs[placement.node].append(
                    schemas.NodeJob(
                        job=job.id,
                        attempt=attempt.number,
                        replica=replica_name(placement.group, placement.index),
                        gpu=gpus(gpu),
                        devices=list(placement.devices),
                    )
                )
        for job in pending_rows(db) if count_pending else ():
            self.pending[job.queue] += 1


def queue_tree(
    cluster: Cluster, usage: Usage, *, tenant: str | None = None
) -> schemas.QueueUsageTree:
    """The queue tree with, per pool, nominal, used and borrowed GPUs of each subtree.

    A leaf's ``borrowed`` is what its open attempts were admitted as borrowing; an inner
    queue's is what its subtree holds beyond the inner queue's own nominal quota. With
    ``tenant``, only that tenant's queues and their ancestors are shown (an ancestor's
    numbers still count its whole subtree)."""
    roots = [_queue(root, cluster, usage)[0] for root in cluster.roots]
    if tenant is not None:
        roots = [kept for root in roots if (kept := _prune(root, tenant)) is not None]
    return schemas.QueueUsageTree(queues=roots)


def _prune(queue: schemas.QueueUsageOut, tenant: str) -> schemas.QueueUsageOut | None:
    """``queue`` with only the subtrees holding ``tenant``'s queues; ``None``: none."""
    if queue.tenant == tenant:
        return queue
    children = [kept for child in queue.children if (kept := _prune(child, tenant)) is not None]
    if not children:
        return None
    return queue.model_copy(update={"children": children})


def _queue(
    queue: Queue, cluster: Cluster, usage: Usage
) -> tuple[schemas.QueueUsageOut, dict[str, int], int, int]:
    children = [_queue(child, cluster, usage) for child in queue.children]
    used: dict[str, int] = defaultdict(int)
    pending = usage.pending.get(queue.name, 0) + sum(c[2] for c in children)
    running = usage.running.get(queue.name, 0) + sum(c[3] for c in children)
    for (name, pool), amount in usage.used.items():
        if name == queue.name:
            used[pool] += amount
    for child in children:
        for pool, amount in child[1].items():
            used[pool] += amount
    nominal = {pool: res[GPU] for pool, res in queue.nominal.items()}
    table: dict[str, schemas.PoolUsage] = {}
    for pool in sorted(set(nominal) | set(used)):
        if queue.is_leaf:
            borrowed = usage.borrowed.get((queue.name, pool), 0)
        else:
            borrowed = max(0, used.get(pool, 0) - nominal.get(pool, 0))
        if not (nominal.get(pool) or used.get(pool) or borrowed):
            continue
        table[pool] = schemas.PoolUsage(
            nominal=gpus(nominal.get(pool, 0)),
            used=gpus(used.get(pool, 0)),
            borrowed=gpus(borrowed),
        )
    out = schemas.QueueUsageOut(
        name=queue.name,
        tenant=queue.tenant,
        leaf=queue.is_leaf,
        nominal_gpu={pool: gpus(amount) for pool, amount in nominal.items() if amount},
        children=[c[0] for c in children],
        usage=table,
        pending=pending,
        running=running,
    )
    return out, dict(used), pending, running


def pools(cluster: Cluster, usage: Usage) -> schemas.PoolList:
    """Every pool with its nodes and GPUs: capacity, allocated, free."""
    out: list[schemas.PoolOut] = []
    for name, pool in cluster.pools.items():
        nodes = [n for n in cluster.nodes.values() if n.pool == name]
        capacity = sum(n.capacity[GPU] for n in nodes)
        allocated = sum(usage.on_node.get(n.name, {}).get(GPU, 0) for n in nodes)
        out.append(
            schemas.PoolOut(
                name=name,
                labels=dict(pool.labels),
                price_per_gpu_hour=pool.price_per_gpu_hour,
                nodes=[n.name for n in nodes],
                gpu=schemas.GpuCount(
                    capacity=gpus(capacity),
                    allocated=gpus(allocated),
                    free=gpus(max(0, capacity - allocated)),
                ),
            )
        )
    return schemas.PoolList(pools=out)


def nodes(cluster: Cluster, usage: Usage) -> schemas.NodeList:
    """Every declared node with capacity, allocated and free amounts and its replicas."""
    out: list[schemas.NodeOut] = []
    for node in cluster.nodes.values():
        capacity = node.capacity.as_dict()
        held = dict(usage.on_node.get(node.name, {}))
        free = {key: max(0, amount - held.get(key, 0)) for key, amount in capacity.items()}
        out.append(
            schemas.NodeOut(
                name=node.name,
                pool=node.pool,
                healthy=node.healthy,
                topology=dict(node.topology),
                capacity=_amounts(capacity),
                allocated=_amounts(held),
                free=_amounts(free),
                jobs=usage.node_jobs.get(node.name, []),
            )
        )
    return schemas.NodeList(nodes=out)
