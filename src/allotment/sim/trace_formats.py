"""Trace files in the formats ``allot sim`` knows, told apart by their header line.

- ``generic``: the trace CSV of :mod:`allotment.sim.trace`.
- ``philly``: the Microsoft Philly window (``job_id,vc,submit_time_s,duration_s,num_gpus,
  gpu_time_s,timestamp``). Every ``vc`` is a leaf queue; a job of more than 8 GPUs is a
  gang of ``ceil(n/8)`` equal replicas (``ceil(n/replicas)`` GPUs each, so 12 GPUs are
  2 x 6). Its cluster comes from the node file ``vc,node num``: one pool ``philly`` of
  8-GPU nodes, a root queue ``philly`` and a leaf per VC guaranteed its nodes x 8 GPUs.
- ``alibaba-openb``: the pod list of Alibaba's cluster-trace-gpu-v2023 (``name,cpu_milli,
  memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
  scheduled_time``). A pod is submitted at ``creation_time`` and runs ``deletion_time -
  scheduled_time``; pods never scheduled (no ``scheduled_time``) are left out and
  counted. ``gpu_milli`` is per GPU (``1,460`` is 0.46 of one GPU, ``2,1000`` two whole
  ones); ``gpu_spec`` (``V100M16|V100M32``, empty: any) lists acceptable pools; ``qos``
  maps to a priority class (:data:`QOS_PRIORITY_CLASSES`). Its cluster comes from the node
  file ``sn,cpu_milli,memory_mib,gpu,model``: one pool per GPU model (lower-case), and one
  leaf queue ``openb`` whose nominal quota is the whole fleet.

The clusters are built as a ``cluster.yaml`` would be (:class:`ClusterFile`, then
:meth:`Cluster.from_file`), so every rule of a cluster file holds. Every problem is a
:class:`TraceError` naming the file and the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from allotment.domain.cluster import Cluster
from allotment.domain.resources import MILLI
from allotment.sim.csv_cells import (
    build_cluster,
    cell,
    not_utf8,
    pool_name,
    queue_name,
    read_lines,
    table,
    whole,
)
from allotment.sim.trace import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    TraceError,
    TraceJob,
    first_use,
    parse_seconds,
    read_trace_rows,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceFormat:
    """A trace format: its name, the columns it needs and may have, and its node file."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    nodes_file: str | None = None
    """The node file looked for next to the trace (``None``: the format has none)."""
    nodes_columns: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        return self.required + self.optional

    def describe(self) -> str:
        text = f"{self.name} ({', '.join(self.required)}"
        if self.optional:
            text += f"; optional {', '.join(self.optional)}"
        return text + ")"


GENERIC = TraceFormat(name="generic", required=REQUIRED_COLUMNS, optional=OPTIONAL_COLUMNS)
PHILLY = TraceFormat(
    name="philly",
    required=("job_id", "vc", "submit_time_s", "duration_s", "num_gpus"),
    optional=("gpu_time_s", "timestamp"),
    nodes_file="philly_vc_nodes_helios.csv",
    nodes_columns=("vc", "node num"),
)
ALIBABA_OPENB = TraceFormat(
    name="alibaba-openb",
    required=(
        "name",
        "cpu_milli",
        "memory_mib",
        "num_gpu",
        "gpu_milli",
        "gpu_spec",
        "qos",
        "creation_time",
        "deletion_time",
        "scheduled_time",
    ),
    optional=("pod_phase",),
    nodes_file="alibaba_openb_node_list_gpu_node.csv",
    nodes_columns=("sn", "cpu_milli", "memory_mib", "gpu", "model"),
)
FORMATS = (GENERIC, PHILLY, ALIBABA_OPENB)

PHILLY_GPUS_PER_NODE = 8
PHILLY_ROOT = "philly"
OPENB_QUEUE = "openb"
QOS_PRIORITY_CLASSES = {
    "ls": "production",
    "guaranteed": "training",
    "burstable": "training",
    "be": "experiment",
}
"""Alibaba ``qos`` (any case) to the default priority classes: latency-sensitive pods are
``production`` (never preempted), Kubernetes Guaranteed and Burstable pods ``training``,
best-effort pods ``experiment`` (lowest that still counts against quota: ``scavenger`` is
borrow-only, and the one ``openb`` queue owns the whole fleet, so has nothing to borrow)."""

_MIB = 2**20 * MILLI


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A trace file read: its format, its jobs, and the cluster of its node file."""

    format: TraceFormat
    jobs: list[TraceJob]
    cluster: Cluster | None = None
    """Built from the node file; ``None`` for the generic format, when not asked for, or
    when there is no node file next to the trace."""
    nodes_file: str | None = None
    """The node file the cluster was built from."""
    skipped: int = 0
    """Rows left out on purpose (Alibaba: pods that were never scheduled)."""
    note: str = ""
    """Why rows were left out, for people."""


def detect_format(header: Sequence[str], *, source: str | None = None) -> TraceFormat:
    """The format whose columns ``header`` has: all it needs and nothing it does not know.

    Raises :class:`TraceError` (line 1) listing every format and its columns otherwise.
    """
    names = [name.strip() for name in header]
    if not any(names):
        raise TraceError("empty file; expected a header line", source=source, line=1)
    given = set(names)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TraceError(f"column(s) {', '.join(twice)} given twice", source=source, line=1)
    for fmt in FORMATS:
        if set(fmt.required) <= given <= set(fmt.columns):
            return fmt
    closest = max(FORMATS, key=lambda f: len(given & set(f.columns)))
    hint = ""
    if given & set(closest.columns):
        missing = [c for c in closest.required if c not in given]
        unknown = [c for c in names if c not in closest.columns]
        parts = []
        if missing:
            parts.append(f"lacks {', '.join(missing)}")
        if unknown:
            parts.append(f"has unknown {', '.join(map(repr, unknown))}")
        hint = f"; as a {closest.name} trace it {' and '.join(parts)}"
    known = "; ".join(f.describe() for f in FORMATS)
    raise TraceError(f"unknown trace format{hint}; known formats: {known}", source=source, line=1)


def load_trace(
    path: str | Path, *, nodes: str | Path | None = None, build_cluster: bool = True
) -> Trace:
    """Read a trace file of any known format (see :func:`detect_format`).

    For a format with a node file, and ``build_cluster``, the cluster is built from
    ``nodes``, else from the format's node file next to the trace when there is one.
    Raises :class:`TraceError` for any problem with the trace or the node file, and for
    ``nodes`` given with a generic trace.
    """
    source = str(path)
    try:
        with Path(path).open(newline="", encoding="utf-8-sig") as handle:
            fmt, jobs, skipped = _read_jobs(handle, source, generic_nodes=nodes is not None)
    except UnicodeDecodeError as exc:
        raise not_utf8(Path(path), source) from exc
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}", source=source) from exc
    if fmt is GENERIC:
        return Trace(format=fmt, jobs=jobs)
    note = f"left out {skipped} pod(s) never scheduled (no scheduled_time)" if skipped else ""
    nodes_path = None if nodes is None else Path(nodes)
    if nodes_path is None and build_cluster and fmt.nodes_file is not None:
        beside = Path(path).parent / fmt.nodes_file
        nodes_path = beside if beside.is_file() else None
    cluster = None
    if build_cluster and nodes_path is not None:
        nodes_source = str(nodes_path)
        if fmt is PHILLY:
            vc_nodes = read_philly_nodes(read_lines(nodes_path), source=nodes_source)
            for job in jobs:
                if job.queue not in vc_nodes:
                    raise TraceError(
                        f"job {job.job_id}: vc {job.queue!r} is not in the node file "
                        f"{nodes_source}; VCs there: {', '.join(vc_nodes)}",
                        source=source,
                        line=job.line,
                    )
            cluster = philly_cluster(vc_nodes, source=nodes_source)
        else:
            cluster = openb_cluster(
                read_openb_nodes(read_lines(nodes_path), source=nodes_source), source=nodes_source
            )
    return Trace(
        format=fmt,
        jobs=jobs,
        cluster=cluster,
        nodes_file=None if cluster is None else str(nodes_path),
        skipped=skipped,
        note=note,
    )


def _read_jobs(
    handle: TextIO, source: str, *, generic_nodes: bool
) -> tuple[TraceFormat, list[TraceJob], int]:
    header, rows = table(handle, source)
    fmt = detect_format(header, source=source)
    if fmt is GENERIC:
        if generic_nodes:
            raise TraceError(
                "a node file goes with a philly or alibaba-openb trace; "
                "a generic trace needs a cluster file",
                source=source,
            )
        handle.seek(0)
        return fmt, read_trace_rows(handle, source=source), 0
    if fmt is PHILLY:
        return fmt, _philly_jobs(header, rows, source), 0
    jobs, skipped = _openb_jobs(header, rows, source)
    return fmt, jobs, skipped


# -- Philly ---------------------------------------------------------------------------


def read_philly_rows(lines: Iterable[str], *, source: str | None = None) -> list[TraceJob]:
    """Parse Philly window lines (header first) into jobs, in file order."""
    header, rows = table(lines, source)
    if detect_format(header, source=source) is not PHILLY:
        raise TraceError(f"not a philly trace: {PHILLY.describe()}", source=source, line=1)
    return _philly_jobs(header, rows, source)


def philly_gang(gpus: int) -> tuple[int, int]:
    """``(replicas, GPUs per replica)`` for a Philly job of ``gpus`` GPUs: one replica up
    to a node's 8, else ``ceil(gpus/8)`` equal replicas of ``ceil(gpus/replicas)`` (12
    GPUs: 2 x 6, 16: 2 x 8; a total that does not divide evenly is rounded up)."""
    if gpus <= PHILLY_GPUS_PER_NODE:
        return 1, gpus
    replicas = -(-gpus // PHILLY_GPUS_PER_NODE)
    return replicas, -(-gpus // replicas)


def _philly_jobs(
    header: list[str], rows: Iterator[tuple[int, list[str]]], source: str | None
) -> list[TraceJob]:
    at = {name: i for i, name in enumerate(header)}
    i_id, i_vc, i_submit, i_duration, i_gpus = (at[c] for c in PHILLY.required)
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        try:
            job_id = cell(row, i_id, "job_id")
            gpus = whole(row, i_gpus, "num_gpus")
            replicas, per_replica = philly_gang(gpus)
            job = TraceJob(
                job_id=job_id,
                submit_time=parse_seconds(cell(row, i_submit, "submit_time_s"), "submit_time_s"),
                duration=parse_seconds(cell(row, i_duration, "duration_s"), "duration_s"),
                queue=cell(row, i_vc, "vc"),
                gpus=per_replica * MILLI,
                replicas=replicas,
                line=line,
            )
        except ValueError as exc:
            raise TraceError(str(exc), source=source, line=line) from None
        first_use(seen, job_id, line, column="job_id", source=source)
        jobs.append(job)
    return jobs


def read_philly_nodes(lines: Iterable[str], *, source: str | None = None) -> dict[str, int]:
    """Parse a Philly node file (``vc,node num``) into nodes per VC, in file order."""
    at, rows = _nodes_table(lines, PHILLY, source)
    vcs: dict[str, int] = {}
    where: dict[str, int] = {}
    for line, row in rows:
        try:
            vc = queue_name(cell(row, at["vc"], "vc"), "vc")
            count = whole(row, at["node num"], "node num")
            if count < 1:
                raise ValueError(f"node num must be at least 1, got {count}")
        except ValueError as exc:
            raise TraceError(str(exc), source=source, line=line) from None
        first_use(where, vc, line, column="vc", source=source)
        vcs[vc] = count
    if not vcs:
        raise TraceError("no VCs listed", source=source)
    return vcs


def philly_pool(vc: str) -> str:
    """The pool of a VC's own nodes."""
    return f"vc-{vc}"


def philly_cluster(vc_nodes: dict[str, int], *, source: str | None = None) -> Cluster:
    """The cluster of a Philly node file, as Philly ran it: each VC owns its nodes (a
    pool ``vc-<name>`` of 8-GPU nodes, GPUs only: the trace asks for nothing else) and
    is a leaf queue guaranteed all of them (``nodes x 8`` GPUs), under a root queue
    ``philly``. Without borrowing a VC runs on its own nodes only (the Helios setup);
    with it, a VC may borrow another's idle nodes and is preempted when they are
    reclaimed."""
    data: dict[str, Any] = {
        "pools": [{"name": philly_pool(vc)} for vc in vc_nodes],
        "nodes": [
            {
                "name_prefix": f"{vc}-",
                "count": count,
                "pool": philly_pool(vc),
                "capacity": {"gpu": PHILLY_GPUS_PER_NODE},
            }
            for vc, count in vc_nodes.items()
        ],
        "queues": [
            {
                "name": PHILLY_ROOT,
                "children": [
                    {"name": vc, "quota": {philly_pool(vc): {"gpu": count * PHILLY_GPUS_PER_NODE}}}
                    for vc, count in vc_nodes.items()
                ],
            }
        ],
    }
    return build_cluster(data, source)


# -- Alibaba openb --------------------------------------------------------------------


def read_openb_pods(
    lines: Iterable[str], *, source: str | None = None
) -> tuple[list[TraceJob], int]:
    """Parse Alibaba openb pod-list lines (header first): the pods that ran, in file
    order, and how many were left out because they were never scheduled."""
    header, rows = table(lines, source)
    if detect_format(header, source=source) is not ALIBABA_OPENB:
        raise TraceError(
            f"not an alibaba-openb trace: {ALIBABA_OPENB.describe()}", source=source, line=1
        )
    return _openb_jobs(header, rows, source)


def _openb_jobs(
    header: list[str], rows: Iterator[tuple[int, list[str]]], source: str | None
) -> tuple[list[TraceJob], int]:
    at = {name: i for i, name in enumerate(header)}
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    skipped = 0
    for line, row in rows:
        try:
            job = _openb_pod(row, at, line)
        except ValueError as exc:
            raise TraceError(str(exc), source=source, line=line) from None
        if job is None:
            skipped += 1
            continue
        first_use(seen, job.job_id, line, column="name", source=source)
        jobs.append(job)
    return jobs, skipped


def _openb_pod(row: list[str], at: dict[str, int], line: int) -> TraceJob | None:
    name = cell(row, at["name"], "name")
    cpu = whole(row, at["cpu_milli"], "cpu_milli")
    memory = whole(row, at["memory_mib"], "memory_mib")
    num_gpu = whole(row, at["num_gpu"], "num_gpu")
    gpu_milli = whole(row, at["gpu_milli"], "gpu_milli")
    if num_gpu == 0 and gpu_milli != 0:
        raise ValueError(f"gpu_milli is {gpu_milli} for a pod of no GPUs (num_gpu 0)")
    if num_gpu > 0 and not 1 <= gpu_milli <= MILLI:
        raise ValueError(f"gpu_milli must be between 1 and {MILLI} per GPU, got {gpu_milli}")
    if num_gpu > 1 and gpu_milli != MILLI:
        raise ValueError(
            f"a share of several GPUs (num_gpu {num_gpu}, gpu_milli {gpu_milli}) cannot be "
            "asked for; a pod of more than one GPU takes them whole"
        )
    qos = cell(row, at["qos"], "qos")
    priority_class = QOS_PRIORITY_CLASSES.get(qos.lower())
    if priority_class is None:
        known = ", ".join(f"{q} -> {c}" for q, c in QOS_PRIORITY_CLASSES.items())
        raise ValueError(f"unknown qos {qos!r}; known (any case): {known}")
    pools: list[str] = []
    for part in row[at["gpu_spec"]].split("|"):
        if part.strip():
            pool = pool_name(part.strip(), "gpu_spec")
            if pool not in pools:
                pools.append(pool)
    created = parse_seconds(cell(row, at["creation_time"], "creation_time"), "creation_time")
    scheduled_text = row[at["scheduled_time"]].strip()
    if not scheduled_text:
        return None
    scheduled = parse_seconds(scheduled_text, "scheduled_time")
    deleted = parse_seconds(cell(row, at["deletion_time"], "deletion_time"), "deletion_time")
    if deleted < scheduled:
        raise ValueError(
            f"deletion_time {deleted:g} is before scheduled_time {scheduled:g}: a negative duration"
        )
    return TraceJob(
        job_id=name,
        submit_time=created,
        duration=deleted - scheduled,
        queue=OPENB_QUEUE,
        gpus=num_gpu * gpu_milli,
        cpu=cpu,
        memory=memory * _MIB,
        pools=tuple(pools),
        priority_class=priority_class,
        line=line,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenbNode:
    """A node of the Alibaba openb node list."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    line: int | None = None

    @property
    def pool(self) -> str:
        return self.model.lower()


def read_openb_nodes(lines: Iterable[str], *, source: str | None = None) -> list[OpenbNode]:
    """Parse an Alibaba openb node list (``sn,cpu_milli,memory_mib,gpu,model``)."""
    at, rows = _nodes_table(lines, ALIBABA_OPENB, source)
    nodes: list[OpenbNode] = []
    where: dict[str, int] = {}
    for line, row in rows:
        try:
            model = cell(row, at["model"], "model")
            pool_name(model, "model")
            node = OpenbNode(
                name=cell(row, at["sn"], "sn"),
                cpu_milli=whole(row, at["cpu_milli"], "cpu_milli"),
                memory_mib=whole(row, at["memory_mib"], "memory_mib"),
                gpus=whole(row, at["gpu"], "gpu"),
                model=model,
                line=line,
            )
        except ValueError as exc:
            raise TraceError(str(exc), source=source, line=line) from None
        first_use(where, node.name, line, column="sn", source=source)
        nodes.append(node)
    if not nodes:
        raise TraceError("no nodes listed", source=source)
    return nodes


def openb_cluster(nodes: Sequence[OpenbNode], *, source: str | None = None) -> Cluster:
    """The cluster of an openb node list: a pool per GPU model (lower-case, labelled with
    the model), the nodes with their GPUs, CPU and memory, and one leaf queue ``openb``
    whose nominal quota is every pool's GPUs, CPU and memory."""
    totals: dict[str, list[int]] = {}
    models: dict[str, str] = {}
    for node in nodes:
        total = totals.setdefault(node.pool, [0, 0, 0])
        total[0] += node.gpus
        total[1] += node.cpu_milli
        total[2] += node.memory_mib
        models.setdefault(node.pool, node.model)
    data: dict[str, Any] = {
        "pools": [{"name": pool, "labels": {"gpu_model": models[pool]}} for pool in totals],
        "nodes": [
            {
                "name": node.name,
                "pool": node.pool,
                "capacity": {
                    "gpu": node.gpus,
                    "cpu": f"{node.cpu_milli}m",
                    "memory": f"{node.memory_mib}Mi",
                },
            }
            for node in nodes
        ],
        "queues": [
            {
                "name": OPENB_QUEUE,
                "quota": {
                    pool: {"gpu": gpu, "cpu": f"{cpu}m", "memory": f"{memory}Mi"}
                    for pool, (gpu, cpu, memory) in totals.items()
                },
            }
        ],
    }
    return build_cluster(data, source)


# -- helpers --------------------------------------------------------------------------


def _nodes_table(
    lines: Iterable[str], fmt: TraceFormat, source: str | None
) -> tuple[dict[str, int], Iterator[tuple[int, list[str]]]]:
    header, rows = table(lines, source)
    if sorted(header) != sorted(fmt.nodes_columns):
        raise TraceError(
            f"not a {fmt.name} node file: its header is {', '.join(header) or 'empty'}; "
            f"expected {', '.join(fmt.nodes_columns)}",
            source=source,
            line=1,
        )
    return {name: i for i, name in enumerate(header)}, rows
