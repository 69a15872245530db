"""Wire schemas: the JSON the API reads and writes, separate from the domain models.

Inputs forbid unknown keys, so a typo in a request is an error, not a silently ignored field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_SPEC_CHARS = 512 * 1024
"""Longest job spec text accepted (the body as a whole is capped separately)."""


class Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Output(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SubmitRequest(Input):
    """``POST /jobs``: the job file's text, YAML or JSON, exactly as a user wrote it."""

    spec: str = Field(min_length=1, max_length=MAX_SPEC_CHARS)


class SubmitManyRequest(Input):
    """``POST /jobs:batch``: several job files' texts, stored all together or not at all."""

    specs: list[Annotated[str, Field(min_length=1, max_length=MAX_SPEC_CHARS)]] = Field(
        min_length=1
    )


class ReasonOut(Output):
    code: str
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)
    since: float | None = None


class JobOut(Output):
    id: str
    name: str
    queue: str
    tenant: str
    user: str
    type: str
    priority_class: str
    state: str
    failure_class: str | None
    attempt: int
    submit_time: float
    not_before: float | None
    reason: ReasonOut | None
    spec: dict[str, Any]
    created_at: float
    updated_at: float
    endpoint: str | None = None
    """A notebook's address on the API server (``/nb/<job>/``); ``None`` for others."""


class JobList(Output):
    jobs: list[JobOut]


class JobPage(Output):
    """One page of jobs; pass ``next_after`` as ``after`` for the next (``None``: last page)."""

    jobs: list[JobOut]
    next_after: str | None


class EventOut(Output):
    id: int
    job: str | None
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    message: str
    detail: dict[str, Any]


class EventList(Output):
    job: str
    events: list[EventOut]


class QueueOut(Output):
    name: str
    tenant: str | None
    leaf: bool
    nominal_gpu: dict[str, float | int]
    children: list[QueueOut]


class QueueTree(Output):
    queues: list[QueueOut]


class Health(Output):
    status: str


class ErrorOut(Output):
    """Every error body: a stable ``code``, a ``message`` that says what to change, detail."""

    code: str
    message: str
    fields: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- why


class Position(Output):
    """1-based: ``queue``, the job's place in its queue's order this cycle; ``pool``, its
    place among pending jobs that may use its first pool (priority class, then age)."""

    queue: int | None
    pool: int | None


class Holder(Output):
    """A job holding GPUs the waiting job could use."""

    job: str
    queue: str
    gpu: float | int
    expected_end: str | None
    pool: str
    terminating: bool = False


class ReplicaWhere(Output):
    replica: str
    node: str
    gpu: float | int
    devices: list[int]


class Placement(Output):
    """Where a job that holds an allocation runs."""

    attempt: int
    pool: str
    nodes: list[str]
    replicas: list[ReplicaWhere]


class WhyReason(Output):
    code: str
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)


class WhyOut(Output):
    """``allot why JOB -o json`` (the README's "HTTP API"); ``position`` and
    ``estimated_start`` are null unless the job is pending, ``reason`` unless it is
    pending or ended without success (then its failure class and the ending event's
    message); ``placement`` is set while it holds an allocation."""

    job: str
    state: str
    reason: WhyReason | None
    position: Position | None
    estimated_start: str | None
    holders: list[Holder]
    placement: Placement | None = None
    estimate_basis: Literal["declared", "history"] | None = None
    """What ``estimated_start`` rests on: ``declared`` runtimes and limits of the work
    ahead, or run times guessed from the ``history`` of jobs that finished here."""


# ---------------------------------------------------------------- logs


class LogChunk(Output):
    """Bytes ``offset``..``next_offset`` of one replica's stream, decoded as UTF-8.
    ``eof``: the attempt has ended and everything written has been read."""

    job: str
    attempt: int
    replica: str | None
    stream: str
    replicas: list[str]
    offset: int
    next_offset: int
    data: str
    eof: bool


# ---------------------------------------------------------------- fleet


class PoolUsage(Output):
    """GPUs of one queue in one pool: its nominal quota, what open attempts of its
    subtree hold, and the part of that held beyond its guarantee (borrowed)."""

    nominal: float | int
    used: float | int
    borrowed: float | int


class QueueUsageOut(Output):
    """A queue as ``GET /queues`` shows it: ``QueueOut``'s fields plus usage per pool and
    its subtree's pending and running job counts."""

    name: str
    tenant: str | None
    leaf: bool
    nominal_gpu: dict[str, float | int]
    children: list[QueueUsageOut]
    usage: dict[str, PoolUsage] = Field(default_factory=dict)
    pending: int = 0
    running: int = 0


class QueueUsageTree(Output):
    queues: list[QueueUsageOut]


class GpuCount(Output):
    capacity: float | int
    allocated: float | int
    free: float | int


class PoolOut(Output):
    name: str
    labels: dict[str, str]
    price_per_gpu_hour: float
    nodes: list[str]
    gpu: GpuCount


class PoolList(Output):
    pools: list[PoolOut]


class NodeJob(Output):
    job: str
    attempt: int
    replica: str
    gpu: float | int
    devices: list[int]


class NodeOut(Output):
    """Amounts in natural units: GPUs, CPU cores, bytes."""

    name: str
    pool: str
    healthy: bool
    topology: dict[str, str]
    capacity: dict[str, float | int]
    allocated: dict[str, float | int]
    free: dict[str, float | int]
    jobs: list[NodeJob]


class NodeList(Output):
    nodes: list[NodeOut]


class NodeImages(Output):
    node: str
    images: list[str]
    """The image references present on the node (those the caller may see)."""


class ImagesOut(Output):
    """``GET /images``: the container images on each node, as far as the caller may
    see them (a tenant's principal: only the images its tenant may run)."""

    runtime: Literal["process", "podman"]
    known: bool
    """Whether the executor could tell which images its nodes hold."""
    message: str | None = None
    """Why the images are not known (``known: false``)."""
    nodes: list[NodeImages]
    allowed: list[str] | None = None
    """The image patterns the caller's tenant may run (``None``: a platform admin, who
    sees every image; or plain processes, which run no image)."""
    enforcement: dict[str, str] = Field(default_factory=dict)
    """What the runtime enforces, by aspect (``memory``, ``network``, …), in words."""


# ---------------------------------------------------------------- cluster


MAX_CLUSTER_CHARS = 1024 * 1024


class WhatifRequest(Input):
    """``POST /whatif``: the proposed ``cluster.yaml`` and the window of history to
    replay (as ``GET /whatif``'s query)."""

    text: str = Field(min_length=1, max_length=MAX_CLUSTER_CHARS)
    since: str = Field(default="7d", min_length=1, max_length=64)
    until: str | None = Field(default=None, max_length=64)
    policy: str | None = Field(default=None, max_length=128)
    series: bool = False


class ClusterApply(Input):
    """``PUT /cluster``: ``cluster.yaml`` as written; ``dry_run`` only validates and diffs."""

    text: str = Field(min_length=1, max_length=MAX_CLUSTER_CHARS)
    dry_run: bool = False


class FieldChange(Output):
    """One changed leaf of an object: its dotted path in the object's JSON form (list
    indices as ``[i]``, a key that is not a plain word as ``["key"]``) and the JSON
    values on either side (``null`` where one side has none)."""

    path: str
    old: Any
    new: Any


class SectionDiff(Output):
    """Names added, removed and changed; ``fields`` holds, for each changed name only,
    its changed leaves, sorted by key."""

    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    fields: dict[str, list[FieldChange]] = Field(default_factory=dict)


class ClusterDiff(Output):
    priority_classes: SectionDiff
    pools: SectionDiff
    nodes: SectionDiff
    tenants: SectionDiff
    queues: SectionDiff


class ClusterApplied(Output):
    """``applied``: a new version was stored (false on a dry run or an unchanged text)."""

    dry_run: bool
    applied: bool
    version: int | None
    diff: ClusterDiff


class ClusterText(Output):
    """The applied ``cluster.yaml``; all null before the first apply."""

    version: int | None
    text: str | None
    sha256: str | None
    applied_at: float | None


class TokenCreate(Input):
    """``POST /tokens``. ``tenant`` absent: a platform token (role ``admin`` only).
    ``role`` absent: the user's role in the tenant's members, else ``member``.
    ``expires_in``: a duration (``30d``, ``12h``, seconds); absent: never."""

    user: str = Field(min_length=1, max_length=128)
    tenant: str | None = Field(default=None, min_length=1, max_length=128)
    role: Literal["admin", "member", "viewer"] | None = None
    expires_in: str | float | None = None


class TokenOut(Output):
    id: str
    user: str
    tenant: str | None
    role: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    created_by: str


class TokenIssued(TokenOut):
    """A new token: ``token`` is shown this once and never again."""

    token: str


class TokenList(Output):
    tokens: list[TokenOut]


class AuditRecordOut(Output):
    """One audited API call."""

    id: int
    at: float
    user: str
    tenant: str | None
    action: str
    object: str
    source: str
    result: str
    """``ok``, ``denied``, or the error code."""
    detail: dict[str, Any] = Field(default_factory=dict)
    prev_hash: str
    hash: str


class AuditPage(Output):
    records: list[AuditRecordOut]
    next_after: int | None = None


class AuditProblem(Output):
    id: int
    problem: str


class AuditVerifyOut(Output):
    """The chain checked from its first record: ``first_bad`` is the first record found
    edited, deleted or out of order (``None`` when intact)."""

    ok: bool
    first_bad: AuditProblem | None
    checked: int
    head_hash: str


# ---------------------------------------------------------------- report


class UsageRow(Output):
    """Usage of one group (or ``total``) in the report's window. GPU-hours, core-hours,
    GiB-hours and cost are decimals of at most 6 places; a group's figures are exactly
    the sums of its attempts' records. ``utilization`` = used / (used + idle), the share
    of measured GPU time that was busy; ``measured_fraction`` = (used + idle) /
    allocated; both null when undefined. ``interrupted_gpu_hours``: the allocated
    GPU-hours of attempts the scheduler stopped (preempted or reclaimed), whose work is
    done again unless the job saved a checkpoint."""

    key: str
    jobs: int
    attempts: int
    allocated_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    unmeasured_gpu_hours: float
    measured_fraction: float | None
    utilization: float | None
    cpu_hours: float
    memory_gib_hours: float
    cost: float
    interrupted_gpu_hours: float


class AttemptUsage(Output):
    """One attempt's share of the window (``held_from``..``held_until``, seconds since
    the epoch; ``open``: still holding its allocation at the window's end)."""

    job: str
    attempt: int
    tenant: str
    queue: str
    pool: str
    user: str
    type: str
    priority_class: str
    state: str
    failure_class: str | None
    held_from: float
    held_until: float
    open: bool
    seconds: float
    gpus: float
    price_per_gpu_hour: float
    allocated_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    unmeasured_gpu_hours: float
    cpu_hours: float
    memory_gib_hours: float
    cost: float
    interrupted_gpu_hours: float


class WaitRow(Output):
    """Waits ended by an admission in the window (seconds; nearest-rank percentiles),
    and the jobs still waiting at its end. ``queue`` and ``priority_class`` are null on
    the total."""

    queue: str | None
    priority_class: str | None
    count: int
    mean_s: float | None
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    waiting: int
    waiting_max_s: float | None


class WaitBin(Output):
    label: str
    upper_s: float | None
    """Exclusive upper bound; null for the last, open bin."""
    count: int


class FailureRow(Output):
    failure_class: str
    pool: str
    queue: str
    type: str
    count: int


class InterruptionRow(Output):
    """Preemptions (``kind`` ``preempted``, ``reason`` the cause) and reclamations
    (``reclaimed``, ``reason`` such as ``idle``) of a queue's jobs."""

    kind: str
    reason: str
    queue: str
    count: int


class TimelinePoint(Output):
    """Average GPUs over ``start``..``end``: allocated, covered by samples, and used."""

    start: float
    end: float
    allocated_gpus: float
    measured_gpus: float
    used_gpus: float


class ReportOut(Output):
    """``GET /report``: usage, waste and cost per group, waits, failures, preemptions and
    reclaims over ``since``..``until`` (seconds since the epoch)."""

    since: float
    until: float
    by: str
    tenant: str | None
    """The tenant the report is narrowed to; null: every tenant (a platform admin)."""
    rows: list[UsageRow]
    total: UsageRow
    cost_by_tenant: list[UsageRow]
    waits: list[WaitRow]
    waits_total: WaitRow
    wait_histogram: list[WaitBin]
    failures: list[FailureRow]
    interruptions: list[InterruptionRow]
    timeline: list[TimelinePoint]
    records: list[AttemptUsage] | None = None
    """One per attempt, when asked for with ``jobs=true``."""


# ---------------------------------------------------------------- alerts


class AlertOut(Output):
    """One alert (``kind``: ``max_wait``, …) and the state of its webhook delivery:
    ``pending``, ``delivered``, ``failed`` (tries exhausted) or ``none`` (no webhook)."""

    id: int
    kind: str
    job: str | None
    tenant: str | None
    queue: str | None
    at: float
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)
    delivery: str
    tries: int
    next_try_at: float | None
    delivered_at: float | None
    last_error: str | None


class AlertPage(Output):
    alerts: list[AlertOut]
    next_after: int | None = None
