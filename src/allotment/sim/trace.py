"""Reading workload traces for replay: the generic trace CSV of the README (the real
traces' formats are in :mod:`allotment.sim.trace_formats`).

Columns: ``job_id, submit_time, duration, queue, gpus`` and optionally ``replicas, cpu,
memory, pool, priority_class, type, max_runtime``. ``gpus``, ``cpu`` and ``memory`` are
per replica and written as people write quantities (``8``, ``0.5``, ``500m``, ``64Gi``);
times are seconds (``max_runtime`` also takes ``2h``). ``duration`` is the true run time:
the replay uses it to end jobs, the scheduler never sees it.

Every problem names the file and the line it is on.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from allotment.domain.cluster import Cluster
from allotment.domain.errors import AllotmentError, InvalidInput
from allotment.domain.job import JobType
from allotment.domain.resources import GPU, parse_quantity
from allotment.scheduler.snapshot import ReplicaRequest

REQUIRED_COLUMNS = ("job_id", "submit_time", "duration", "queue", "gpus")
OPTIONAL_COLUMNS = (
    "replicas",
    "cpu",
    "memory",
    "pool",
    "priority_class",
    "type",
    "max_runtime",
    "user",
)
KNOWN_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
MAX_REPLICAS = 10_000
_EXTRA = "\x00extra"


class TraceError(InvalidInput):
    """A trace file that cannot be replayed; names the file and, for a row, its line."""

    code = "invalid_trace"

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        where = source or "trace"
        if line is not None:
            where = f"{where} line {line}"
        super().__init__(f"{where}: {message}", fields={"source": source, "line": line})
        self.line = line


def first_use(
    seen: dict[str, int], key: str, line: int, *, column: str, source: str | None
) -> None:
    """Remember that ``key`` (a value of ``column`` that must be unique) is on ``line``;
    raise :class:`TraceError` naming both lines if it was seen before."""
    if key in seen:
        raise TraceError(
            f"{column} {key!r} already used on line {seen[key]}", source=source, line=line
        )
    seen[key] = line


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """One job of a trace. Resources are per replica, in milli-units (``None``: not given)."""

    job_id: str
    submit_time: float
    duration: float
    queue: str
    gpus: int
    replicas: int = 1
    cpu: int | None = None
    memory: int | None = None
    pool: str | None = None
    """The one pool the job must run in; ``None`` when it may run in several or any."""
    pools: tuple[str, ...] = ()
    """The pools the job may run in, any of them; empty: any pool open to its queue.
    ``pool=X`` alone gives ``pools=(X,)``, and ``pools`` of one gives that ``pool``."""
    priority_class: str | None = None
    type: JobType = JobType.TRAINING
    max_runtime: float | None = None
    line: int | None = None
    """Where it was read from, for messages."""
    requests: tuple[ReplicaRequest, ...] = ()
    """Its replica groups, when it has several or more than ``gpus``, ``cpu`` and
    ``memory`` say (a recorded job); empty: ``replicas`` of those."""
    expected_runtime: float | None = None
    """A runtime the job declared: the scheduler sees it (a true ``duration`` it never
    sees, unless the policy is an oracle)."""
    preemptible: bool = False
    runs: tuple[tuple[float, str], ...] = ()
    """A recorded job's runs in order: how long each held its resources and how it
    ended. Every run but the last ended ``failed`` and was retried; the last run's
    ending is the job's (``inf``: still running at the end of the recording). Empty:
    one run of ``duration``."""
    withdraw_at: float | None = None
    """When its user cancelled it while it waited (trace seconds, before any time
    scale): it leaves then, or is stopped then if the replay started it already."""
    user: str | None = None
    """Who submitted it, where the trace says: start forecasts (``--predict-every``)
    learn a job's run time from its user's finished jobs first. The scheduler never
    sees it."""

    def __post_init__(self) -> None:
        if self.pool is not None:
            if not self.pools:
                object.__setattr__(self, "pools", (self.pool,))
            elif self.pools != (self.pool,):
                raise ValueError(f"pool {self.pool!r} and pools {self.pools!r} disagree")
        elif len(self.pools) == 1:
            object.__setattr__(self, "pool", self.pools[0])

    @property
    def total_gpus(self) -> int:
        """All replicas together, milli-GPUs."""
        if self.requests:
            return sum(r.count * r.resources.get(GPU, 0) for r in self.requests)
        return self.gpus * self.replicas


def parse_seconds(value: str, column: str, *, allow_units: bool = False) -> float:
    """A cell of seconds: a finite number >= 0 (``allow_units``: also ``2h``, ``90m``).
    Raises ValueError naming ``column``."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        if allow_units:
            from allotment.domain.durations import parse_duration

            try:
                return parse_duration(text, name=column)
            except AllotmentError as exc:
                raise ValueError(f"{column}: {exc.message}") from None
        raise ValueError(f"{column} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{column} must be a finite, non-negative number, got {value!r}")
    return seconds


def _quantity(value: str, column: str) -> int:
    try:
        return parse_quantity(value.strip(), name=column)
    except AllotmentError as exc:
        raise ValueError(exc.message) from None


def _row(cells: dict[str, str], line: int) -> TraceJob:
    def get(column: str) -> str | None:
        value = cells.get(column)
        if value is None:
            return None
        value = value.strip()
        return value or None

    job_id = get("job_id")
    if job_id is None:
        raise ValueError("job_id is empty")
    queue = get("queue")
    if queue is None:
        raise ValueError("queue is empty")
    for column in REQUIRED_COLUMNS:
        if get(column) is None:
            raise ValueError(f"{column} is empty")
    replicas_text = get("replicas")
    replicas = 1
    if replicas_text is not None:
        try:
            replicas = int(replicas_text)
        except ValueError:
            raise ValueError(f"replicas must be a whole number, got {replicas_text!r}") from None
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas}")
    type_text = get("type")
    job_type = JobType.TRAINING
    if type_text is not None:
        try:
            job_type = JobType(type_text)
        except ValueError:
            known = ", ".join(t.value for t in JobType)
            raise ValueError(f"unknown type {type_text!r}; known types: {known}") from None
    cpu = get("cpu")
    memory = get("memory")
    max_runtime = get("max_runtime")
    max_runtime_s = None
    if max_runtime is not None:
        max_runtime_s = parse_seconds(max_runtime, "max_runtime", allow_units=True)
        if max_runtime_s <= 0:
            raise ValueError("max_runtime must be positive")
    return TraceJob(
        job_id=job_id,
        submit_time=parse_seconds(cells["submit_time"], "submit_time"),
        duration=parse_seconds(cells["duration"], "duration"),
        queue=queue,
        gpus=_quantity(cells["gpus"], "gpus"),
        replicas=replicas,
        cpu=None if cpu is None else _quantity(cpu, "cpu"),
        memory=None if memory is None else _quantity(memory, "memory"),
        pool=get("pool"),
        priority_class=get("priority_class"),
        type=job_type,
        max_runtime=max_runtime_s,
        line=line,
        user=get("user"),
    )


def read_trace_rows(lines: Iterable[str], *, source: str | None = None) -> list[TraceJob]:
    """Parse generic trace CSV lines (header first) into jobs, in file order.

    Raises :class:`TraceError` for a missing or unknown column, a bad cell (naming the
    line and the column), or a job id used twice.
    """
    reader = csv.DictReader(lines, restkey=_EXTRA)
    header = [name.strip() for name in reader.fieldnames or []]
    if not header:
        raise TraceError("empty file; expected a header line", source=source, line=1)
    reader.fieldnames = header
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise TraceError(
            f"missing column(s) {', '.join(missing)}; a trace needs {', '.join(REQUIRED_COLUMNS)}",
            source=source,
            line=1,
        )
    unknown = [c for c in header if c not in KNOWN_COLUMNS]
    if unknown:
        raise TraceError(
            f"unknown column(s) {', '.join(map(repr, unknown))}; known columns: "
            f"{', '.join(KNOWN_COLUMNS)}",
            source=source,
            line=1,
        )
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    try:
        for cells in reader:
            line = reader.line_num
            extra = cells.pop(_EXTRA, None)
            if extra:
                raise TraceError(
                    f"{len(header) + len(extra)} cells, the header has {len(header)}",
                    source=source,
                    line=line,
                )
            if all(not (v or "").strip() for v in cells.values()):
                continue
            if any(v is None for v in cells.values()):
                raise TraceError(
                    f"too few cells, the header has {len(header)}", source=source, line=line
                )
            try:
                job = _row(cells, line)
            except ValueError as exc:
                raise TraceError(str(exc), source=source, line=line) from None
            first_use(seen, job.job_id, line, column="job_id", source=source)
            jobs.append(job)
    except csv.Error as exc:
        raise TraceError(f"not valid CSV: {exc}", source=source, line=reader.line_num) from exc
    return jobs


def read_trace(path: str | Path) -> list[TraceJob]:
    """Read the jobs of a trace file in any format :mod:`allotment.sim.trace_formats`
    knows, told apart by the header: generic (see :func:`read_trace_rows`), Philly or
    Alibaba openb. :func:`~allotment.sim.trace_formats.load_trace` also builds the
    cluster of a real trace's node file."""
    from allotment.sim.trace_formats import load_trace

    return load_trace(path, build_cluster=False).jobs


def check_trace(jobs: Iterable[TraceJob], cluster: Cluster, *, source: str | None = None) -> None:
    """Raise :class:`TraceError` for the first job the cluster cannot accept: an unknown or
    non-leaf queue (listing the leaves), a pool (any of ``pools``) not open to its queue,
    a priority class the queue does not allow."""
    leaves = ", ".join(sorted(q.name for q in cluster.leaves)) or "none declared"
    open_pools: dict[str, list[str]] = {}
    for job in jobs:
        queue = cluster.queues.get(job.queue)
        if queue is None:
            raise TraceError(
                f"job {job.job_id}: unknown queue {job.queue!r}; queues in the cluster: {leaves}",
                source=source,
                line=job.line,
            )
        if not queue.is_leaf:
            raise TraceError(
                f"job {job.job_id}: queue {job.queue!r} has child queues; jobs go to leaves: "
                f"{leaves}",
                source=source,
                line=job.line,
            )
        if job.pools:
            pools = open_pools.get(queue.name)
            if pools is None:
                pools = open_pools[queue.name] = cluster.allowed_pools(queue)
            for pool in job.pools:
                if pool not in pools:
                    raise TraceError(
                        f"job {job.job_id}: pool {pool!r} is not open to queue {queue.name}; "
                        f"open pools: {', '.join(pools) or 'none'}",
                        source=source,
                        line=job.line,
                    )
        if cluster.priority_class_for(queue, job.priority_class) is None:
            allowed = queue.spec.priority_classes or sorted(cluster.priority_classes)
            raise TraceError(
                f"job {job.job_id}: priority class {job.priority_class!r} is not allowed in "
                f"queue {queue.name}; allowed: {', '.join(allowed)}",
                source=source,
                line=job.line,
            )


def jittered(jobs: Iterable[TraceJob], seed: int) -> list[TraceJob]:
    """The same jobs, each submitted up to one second later (uniform, from ``seed``),
    with its withdrawal moved as much: the same workload, with the order of jobs
    submitted within a second of each other, and every tie after it, drawn anew. Replays
    of a few such copies show how much of a difference between policies is chance."""
    draw = random.Random(seed).random
    out = []
    for job in jobs:
        delay = draw()
        withdraw = None if job.withdraw_at is None else job.withdraw_at + delay
        out.append(replace(job, submit_time=job.submit_time + delay, withdraw_at=withdraw))
    return out
