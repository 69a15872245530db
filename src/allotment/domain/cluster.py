"""The cluster as platform teams describe it: priority classes, pools, nodes, tenants and
the queue tree (``cluster.yaml``; ``examples/cluster.yaml`` shows every field).

The models here read user input, so they forbid unknown keys and parse quantities and
durations once, at the edge. :class:`Cluster` is the validated whole, with the
cross-references checked (a queue's pool exists, children's guarantees fit in their
parent's) and the tree flattened for fast look-ups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AliasChoices, Field, model_validator

from allotment.domain.durations import TimeWindow
from allotment.domain.errors import ConfigError, Issue
from allotment.domain.executor import ExecutorSpec, RuntimeSpec
from allotment.domain.fields import (
    MAX_JOB_REPLICAS,
    Duration,
    Model,
    Name,
    PoolQuota,
    ResourcesField,
    Text,
)
from allotment.domain.lifecycle import FailureClass
from allotment.domain.resources import GPU, Resources, format_quantity
from allotment.domain.tenancy import Tenant, check_uids, derived_uid
from allotment.domain.upkeep import OrphanPolicy, ReapingPolicy, TelemetrySettings


class PriorityClass(Model):
    """A named priority with its rules."""

    name: Name
    value: int = Field(ge=-1_000_000, le=1_000_000)
    preemptible: bool = True
    """Whether jobs of this class may be preempted."""
    can_preempt: bool = True
    """Whether jobs of this class may preempt others."""
    borrow_only: bool = False
    """Runs only on idle, borrowed capacity and is the first victim of reclaim."""
    description: str = ""


DEFAULT_PRIORITY_CLASSES = (
    PriorityClass(name="production", value=1000, preemptible=False),
    PriorityClass(name="key-project", value=800),
    PriorityClass(name="training", value=500),
    PriorityClass(name="experiment", value=100),
    PriorityClass(name="scavenger", value=0, borrow_only=True),
)
DEFAULT_PRIORITY_CLASS = "training"


class Pool(Model):
    """A set of alike nodes (Kueue's resource flavor), with a price and an access list."""

    name: Name
    labels: dict[str, Text] = Field(default_factory=dict)
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    queues: list[str] | None = None
    """Queues (or ancestors of queues) that may use this pool; absent means all."""


class Device(Model):
    """One accelerator on a node."""

    index: int = Field(ge=0)
    uuid: str | None = None
    model: str | None = None
    memory: ResourcesField | None = None


class Node(Model):
    """A machine: capacity, pool, topology labels (``rack``, ``block``), health, devices."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    pool: str
    capacity: ResourcesField
    topology: dict[str, Text] = Field(default_factory=dict)
    healthy: bool = True
    devices: list[Device] = Field(default_factory=list)

    @property
    def gpu_count(self) -> int:
        """Whole GPUs on the node."""
        return self.capacity[GPU] // 1000


class NodeEntry(Model):
    """A node line in ``cluster.yaml``: one ``name``, or ``name_prefix`` with ``count``."""

    name: str | None = None
    name_prefix: str | None = None
    count: int | None = Field(default=None, ge=1, le=100_000)
    start: int = Field(default=1, ge=0)
    pool: str
    capacity: ResourcesField
    topology: dict[str, Text] = Field(default_factory=dict)
    healthy: bool = True
    devices: list[Device] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_naming(self) -> NodeEntry:
        if (self.name is None) == (self.name_prefix is None):
            raise ValueError("give either name, or name_prefix with count")
        if self.name_prefix is not None and self.count is None:
            raise ValueError("name_prefix needs count")
        if self.name is not None and self.count is not None:
            raise ValueError("count goes with name_prefix, not name")
        return self

    def expand(self) -> list[Node]:
        common: dict[str, Any] = {
            "pool": self.pool,
            "capacity": self.capacity,
            "topology": self.topology,
            "healthy": self.healthy,
            "devices": self.devices,
        }
        if self.name is not None:
            return [Node(name=self.name, **common)]
        assert self.name_prefix is not None and self.count is not None
        width = max(2, len(str(self.start + self.count - 1)))
        return [
            Node(name=f"{self.name_prefix}{i:0{width}d}", **common)
            for i in range(self.start, self.start + self.count)
        ]


PreemptionMode = Literal["never", "lower_priority", "any"]
Queueing = Literal["best_effort", "strict"]
"""A queue's order: ``best_effort`` (a head short of quota lets the jobs behind it that
fit start) or ``strict`` (nothing starts past a head that waits for quota)."""


class PreemptionPolicy(Model):
    """``within_queue``: may a job preempt jobs of its own queue (by lower priority)?
    ``reclaim``: may it preempt jobs of other queues that borrow its guaranteed quota
    (``lower_priority`` = only those of lower priority)?"""

    within_queue: PreemptionMode = "lower_priority"
    reclaim: PreemptionMode = "any"


class RetryPolicy(Model):
    """Which failure classes are retried, how often, and with what back-off."""

    max_attempts: int = Field(default=1, ge=1, le=1000)
    on: list[FailureClass] = Field(
        default_factory=lambda: [FailureClass.NODE_FAILURE, FailureClass.PREEMPTED]
    )
    backoff: Duration = 30.0
    backoff_factor: float = Field(default=2.0, ge=1.0, le=10.0)
    max_backoff: Duration = 3600.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempts count from 1)."""
        return float(min(self.max_backoff, self.backoff * self.backoff_factor ** (attempt - 1)))


class TimeWindowSpec(Model):
    days: str = "mon-sun"
    start: str = Field(alias="from")
    end: str = Field(alias="to")

    @model_validator(mode="after")
    def _parses(self) -> TimeWindowSpec:
        TimeWindow.parse(self.days, self.start, self.end)
        return self

    def window(self) -> TimeWindow:
        return TimeWindow.parse(self.days, self.start, self.end)


class QueueSpec(Model):
    """One node of the queue tree as written; jobs go to leaves (those without children)."""

    name: Name
    tenant: str | None = None
    quota: PoolQuota = Field(default_factory=dict)
    borrowing_limit: PoolQuota | None = None
    lending_limit: PoolQuota | None = None
    priority_classes: list[str] | None = None
    default_priority_class: str | None = None
    pools: list[str] | None = None
    max_job: ResourcesField | None = None
    max_job_replicas: int | None = Field(default=None, ge=1, le=MAX_JOB_REPLICAS)
    """The most replicas one job may have; inherited by queues below that set none."""
    max_wait: Duration | None = None
    queueing: Queueing | None = None
    """``best_effort`` (default) or ``strict``; inherited by queues below that set none."""
    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy)
    time_windows: list[TimeWindowSpec] = Field(default_factory=list)
    retry: RetryPolicy | None = None
    weight: float = Field(default=1.0, gt=0, le=1000)
    """Fair-share weight among queues of equal priority."""
    submitters: list[str] | None = None
    network: bool = False
    """Whether this queue's jobs may ask for the network (``network: true``); without
    it, containers run with no network at all."""
    reaping: ReapingPolicy | None = Field(
        default=None, validation_alias=AliasChoices("reaping", "reclaim")
    )
    """Idle and TTL reaping; inherited by queues below that set none. ``reclaim`` is
    the key's former name, still read (configurations stored before the rename)."""
    children: list[QueueSpec] = Field(default_factory=list)


class ClusterFile(Model):
    """``cluster.yaml``; every section optional."""

    priority_classes: list[PriorityClass] | None = None
    pools: list[Pool] = Field(default_factory=list)
    nodes: list[NodeEntry] = Field(default_factory=list)
    tenants: list[Tenant] = Field(default_factory=list)
    queues: list[QueueSpec] = Field(default_factory=list)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    orphans: OrphanPolicy = "report"


_Named = TypeVar("_Named", PriorityClass, Pool, Tenant)
_Setting = TypeVar("_Setting")


class Queue:
    """A queue of the validated tree, with its parent and children resolved.

    ``nominal`` of an inner queue without its own quota is the sum of its children's.
    """

    __slots__ = (
        "_windows",
        "children",
        "depth",
        "name",
        "nominal",
        "parent",
        "path",
        "spec",
        "strict",
        "tenant",
    )

    def __init__(self, spec: QueueSpec, parent: Queue | None, tenant: str | None) -> None:
        self.spec = spec
        self.name = spec.name
        self.parent = parent
        self.tenant = tenant
        self.children: list[Queue] = []
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.path: tuple[str, ...] = (spec.name,) if parent is None else (*parent.path, spec.name)
        self.nominal: dict[str, Resources] = dict(spec.quota)
        self._windows = tuple(w.window() for w in spec.time_windows)
        self.strict: bool = self.inherited(lambda spec: spec.queueing) == "strict"
        """Whether this queue keeps strict order (its own ``queueing`` or its nearest
        ancestor's; ``best_effort`` when none sets it). Settled here, as its ancestors
        are (the core asks it of every queue in every cycle)."""

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def time_windows(self) -> tuple[TimeWindow, ...]:
        return self._windows

    def inherited(self, read: Callable[[QueueSpec], _Setting | None]) -> _Setting | None:
        """A setting of this queue's spec, or of its nearest ancestor that sets it."""
        node: Queue | None = self
        while node is not None:
            value = read(node.spec)
            if value is not None:
                return value
            node = node.parent
        return None

    @property
    def reaping(self) -> ReapingPolicy | None:
        """The reaping policy of this queue or its nearest ancestor with one."""
        return self.inherited(lambda spec: spec.reaping)

    @property
    def max_job_replicas(self) -> int:
        """The most replicas one job of this queue may have: its own ``max_job_replicas``
        or its nearest ancestor's, else :data:`MAX_JOB_REPLICAS`."""
        most = self.inherited(lambda spec: spec.max_job_replicas)
        return MAX_JOB_REPLICAS if most is None else most

    def ancestors(self) -> Iterator[Queue]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def __repr__(self) -> str:
        return f"Queue({'/'.join(self.path)})"


class Cluster:
    """The validated cluster: everything ``cluster.yaml`` declares, cross-checked.

    Build with :meth:`from_file` (raises :class:`ConfigError` listing every problem).
    """

    def __init__(
        self,
        *,
        priority_classes: dict[str, PriorityClass],
        pools: dict[str, Pool],
        nodes: dict[str, Node],
        tenants: dict[str, Tenant],
        queues: dict[str, Queue],
        roots: list[Queue],
        source: ClusterFile,
    ) -> None:
        self.priority_classes = priority_classes
        self.pools = pools
        self.nodes = nodes
        self.tenants = tenants
        self.queues = queues
        self.roots = roots
        self.source = source

    @property
    def leaves(self) -> list[Queue]:
        return [q for q in self.queues.values() if q.is_leaf]

    def webhook_of(self, tenant: str | None) -> str | None:
        """Where ``tenant``'s alerts are delivered (``None``: not sent)."""
        spec = self.tenants.get(tenant) if tenant is not None else None
        return spec.webhook.url if spec is not None and spec.webhook is not None else None

    @property
    def executor(self) -> ExecutorSpec:
        return self.source.executor

    @property
    def runtime(self) -> RuntimeSpec:
        """How replicas run (plain processes or containers)."""
        return self.source.executor.runtime

    def uid_of(self, tenant: str) -> int:
        """The uid (and gid) ``tenant``'s containers run under: its own ``uid``, else a
        stable number inside the runtime's range derived from the name."""
        spec = self.tenants.get(tenant)
        if spec is not None and spec.uid is not None:
            return spec.uid
        return derived_uid(tenant, self.runtime)

    def images_of(self, tenant: str) -> list[str]:
        """The image patterns ``tenant`` may run, the runtime's default image first."""
        spec = self.tenants.get(tenant)
        default = self.runtime.default_image
        return ([default] if default else []) + (list(spec.images) if spec else [])

    def with_nodes(self, nodes: dict[str, Node]) -> Cluster:
        """The same cluster on other nodes (an executor's inventory); nodes of a pool
        the cluster does not declare are left out."""
        return Cluster(
            priority_classes=self.priority_classes,
            pools=self.pools,
            nodes={name: node for name, node in nodes.items() if node.pool in self.pools},
            tenants=self.tenants,
            queues=self.queues,
            roots=self.roots,
            source=self.source,
        )

    def queue_may_use_pool(self, queue: Queue, pool: str) -> bool:
        """A pool is open to a leaf if the queue's own ``pools`` (when set) lists it and
        the pool's access list (when set) names the queue or one of its ancestors."""
        if pool not in self.pools:
            return False
        if queue.spec.pools is not None and pool not in queue.spec.pools:
            return False
        access = self.pools[pool].queues
        return access is None or any(name in access for name in queue.path)

    def allowed_pools(self, queue: Queue) -> list[str]:
        return [p for p in self.pools if self.queue_may_use_pool(queue, p)]

    def priority_class_for(self, queue: Queue, requested: str | None) -> PriorityClass | None:
        """The class a job in ``queue`` gets: requested, else the queue's default, else
        ``training`` (or the lowest-valued class). None if the request is not allowed."""
        name = requested or queue.spec.default_priority_class
        if name is None:
            allowed = queue.spec.priority_classes
            if allowed:
                name = allowed[0]
            elif DEFAULT_PRIORITY_CLASS in self.priority_classes:
                name = DEFAULT_PRIORITY_CLASS
            else:
                name = min(self.priority_classes.values(), key=lambda c: c.value).name
        if name not in self.priority_classes:
            return None
        if queue.spec.priority_classes is not None and name not in queue.spec.priority_classes:
            return None
        return self.priority_classes[name]

    @classmethod
    def from_file(cls, file: ClusterFile, *, source: str | None = None) -> Cluster:
        """Cross-check a parsed file and build the cluster; every problem is reported."""
        issues: list[Issue] = []
        classes_list = (
            list(DEFAULT_PRIORITY_CLASSES)
            if file.priority_classes is None
            else list(file.priority_classes)
        )
        classes = _unique(classes_list, "priority_classes", issues)
        pools = _unique(file.pools, "pools", issues)
        tenants = _unique(file.tenants, "tenants", issues)

        nodes: dict[str, Node] = {}
        for i, entry in enumerate(file.nodes):
            if entry.pool not in pools:
                issues.append(_unknown(f"nodes.{i}.pool", "pool", entry.pool, pools))
            for node in entry.expand():
                if node.name in nodes:
                    issues.append(Issue(path=f"nodes.{i}", message=f"duplicate node {node.name!r}"))
                nodes[node.name] = node

        queues: dict[str, Queue] = {}
        roots: list[Queue] = []
        locations: dict[str, str] = {}

        def build(spec: QueueSpec, parent: Queue | None, path: str, tenant: str | None) -> Queue:
            own_tenant = spec.tenant or tenant
            queue = Queue(spec, parent, own_tenant)
            if spec.name in queues:
                issues.append(Issue(path=path, message=f"duplicate queue name {spec.name!r}"))
            queues[spec.name] = queue
            locations.setdefault(spec.name, path)
            _check_queue(spec, path, pools, tenants, classes, issues)
            for j, child in enumerate(spec.children):
                queue.children.append(build(child, queue, f"{path}.children.{j}", own_tenant))
            return queue

        for i, spec in enumerate(file.queues):
            roots.append(build(spec, None, f"queues.{i}", None))

        for queue in list(queues.values()):
            _derive_nominal(queue)
        for queue in list(queues.values()):
            _check_guarantees(queue, locations[queue.name], issues)
        _check_executor(file, pools, issues)
        check_uids(file.tenants, file.executor.runtime, issues)
        for i, pool in enumerate(file.pools):
            for j, access in enumerate(pool.queues or []):
                if access not in queues:
                    issues.append(_unknown(f"pools.{i}.queues.{j}", "queue", access, queues))
        if issues:
            raise ConfigError(issues, source=source)
        return cls(
            priority_classes=classes,
            pools=pools,
            nodes=nodes,
            tenants=tenants,
            queues=queues,
            roots=roots,
            source=file,
        )


def _check_executor(file: ClusterFile, pools: dict[str, Pool], issues: list[Issue]) -> None:
    slurm = file.executor.slurm
    if slurm is None:
        return
    for name in slurm.pools:
        if name not in pools:
            issues.append(_unknown(f"executor.slurm.pools.{name}", "pool", name, pools))
    if file.nodes:
        issues.append(
            Issue(
                path="nodes",
                message="with executor kind slurm the nodes come from Slurm; remove nodes",
            )
        )


def _unique(items: list[_Named], section: str, issues: list[Issue]) -> dict[str, _Named]:
    out: dict[str, _Named] = {}
    for i, item in enumerate(items):
        if item.name in out:
            issues.append(Issue(path=f"{section}.{i}.name", message=f"duplicate {item.name!r}"))
        out[item.name] = item
    return out


def _unknown(path: str, kind: str, name: str, known: dict[str, Any]) -> Issue:
    names = ", ".join(sorted(known)) or "none declared"
    return Issue(path=path, message=f"unknown {kind} {name!r}; known: {names}")


def _check_queue(
    spec: QueueSpec,
    path: str,
    pools: dict[str, Pool],
    tenants: dict[str, Tenant],
    classes: dict[str, PriorityClass],
    issues: list[Issue],
) -> None:
    if spec.tenant is not None and spec.tenant not in tenants:
        issues.append(_unknown(f"{path}.tenant", "tenant", spec.tenant, tenants))
    for section in ("quota", "borrowing_limit", "lending_limit"):
        for pool in getattr(spec, section) or {}:
            if pool not in pools:
                issues.append(_unknown(f"{path}.{section}.{pool}", "pool", pool, pools))
    for j, pool in enumerate(spec.pools or []):
        if pool not in pools:
            issues.append(_unknown(f"{path}.pools.{j}", "pool", pool, pools))
    for j, name in enumerate(spec.priority_classes or []):
        if name not in classes:
            issues.append(_unknown(f"{path}.priority_classes.{j}", "priority class", name, classes))
    default = spec.default_priority_class
    if default is not None:
        if default not in classes:
            issues.append(
                _unknown(f"{path}.default_priority_class", "priority class", default, classes)
            )
        elif spec.priority_classes is not None and default not in spec.priority_classes:
            issues.append(
                Issue(
                    path=f"{path}.default_priority_class",
                    message=f"{default!r} is not among this queue's priority_classes",
                )
            )


def _derive_nominal(queue: Queue) -> dict[str, Resources]:
    """Inner queues without their own quota for a pool/resource guarantee the sum of
    their children's."""
    if not queue.children:
        return queue.nominal
    summed: dict[str, dict[str, int]] = {}
    for child in queue.children:
        for pool, res in _derive_nominal(child).items():
            bucket = summed.setdefault(pool, {})
            for key, amount in res.items():
                bucket[key] = bucket.get(key, 0) + amount
    for pool, totals in summed.items():
        own = queue.spec.quota.get(pool)
        merged = dict(totals)
        if own is not None:
            merged.update(own.as_dict())
        queue.nominal[pool] = Resources(merged)
    return queue.nominal


def _check_guarantees(queue: Queue, path: str, issues: list[Issue]) -> None:
    if not queue.children:
        return
    for pool, own in queue.spec.quota.items():
        for key, amount in own.items():
            children = sum(c.nominal.get(pool, Resources())[key] for c in queue.children)
            if children > amount:
                issues.append(
                    Issue(
                        path=f"{path}.quota.{pool}.{key}",
                        message=(
                            f"children of queue {queue.name} guarantee "
                            f"{format_quantity(key, children)} {key} in pool {pool}, more "
                            f"than its {format_quantity(key, amount)}; "
                            "raise the parent's quota or lower the children's"
                        ),
                    )
                )
