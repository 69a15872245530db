"""What the CLI prints: plain data for ``-o json`` and Rich renderables for people."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.tree import Tree

from allotment.domain.cluster import Cluster, Queue
from allotment.domain.durations import format_duration
from allotment.domain.job import JobSpec
from allotment.domain.resources import GPU, MILLI


def _gpus(milli: int) -> float | int:
    return milli // MILLI if milli % MILLI == 0 else milli / MILLI


def _queue_data(queue: Queue) -> dict[str, Any]:
    return {
        "name": queue.name,
        "tenant": queue.tenant,
        "nominal_gpu": {pool: _gpus(res[GPU]) for pool, res in queue.nominal.items() if res[GPU]},
        "children": [_queue_data(child) for child in queue.children],
    }


def cluster_data(cluster: Cluster) -> dict[str, Any]:
    """The summary ``allot check`` prints: pools, nodes, GPUs, tenants, the queue tree."""
    pools: dict[str, dict[str, Any]] = {
        name: {"name": name, "nodes": 0, "gpus": 0, "labels": dict(pool.labels)}
        for name, pool in cluster.pools.items()
    }
    total_gpus = 0
    for node in cluster.nodes.values():
        entry = pools.get(node.pool)
        gpus = node.capacity[GPU]
        total_gpus += gpus
        if entry is not None:
            entry["nodes"] += 1
            entry["gpus"] += gpus
    for entry in pools.values():
        entry["gpus"] = _gpus(entry["gpus"])
    return {
        "pools": list(pools.values()),
        "nodes": len(cluster.nodes),
        "gpus": _gpus(total_gpus),
        "tenants": sorted(cluster.tenants),
        "priority_classes": [
            {"name": c.name, "value": c.value}
            for c in sorted(cluster.priority_classes.values(), key=lambda c: -c.value)
        ],
        "queues": [_queue_data(root) for root in cluster.roots],
    }


def job_data(job: JobSpec, source: str) -> dict[str, Any]:
    total = job.total_resources()
    return {
        "file": source,
        "name": job.name,
        "queue": job.queue,
        "type": job.type.value,
        "replicas": job.replica_count,
        "gpus": _gpus(total[GPU]),
        "resources": total.display(),
    }


def cluster_view(data: dict[str, Any], source: str) -> RenderableType:
    pools = Table(title=f"{source}: pools", title_justify="left")
    pools.add_column("pool")
    pools.add_column("nodes", justify="right")
    pools.add_column("GPUs", justify="right")
    pools.add_column("labels")
    for pool in data["pools"]:
        labels = ", ".join(f"{k}={v}" for k, v in pool["labels"].items())
        pools.add_row(pool["name"], str(pool["nodes"]), str(pool["gpus"]), labels)
    classes = ", ".join(f"{c['name']} ({c['value']})" for c in data["priority_classes"])
    totals = (
        f"{data['nodes']} nodes, {data['gpus']} GPUs; "
        f"tenants: {', '.join(data['tenants']) or 'none'}; priority classes: {classes}"
    )
    tree = Tree("queues (nominal GPUs per pool)")

    def add(branch: Tree, queue: dict[str, Any]) -> None:
        quota = ", ".join(f"{pool}: {gpus}" for pool, gpus in queue["nominal_gpu"].items())
        tenant = f" [dim]tenant {queue['tenant']}[/dim]" if queue["tenant"] else ""
        node = branch.add(f"[bold]{queue['name']}[/bold]  {quota or 'no quota'}{tenant}")
        for child in queue["children"]:
            add(node, child)

    for root in data["queues"]:
        add(tree, root)
    return Group(pools, totals, tree)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    return format_duration(value)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


ROWS: tuple[tuple[str, str, Any], ...] = (
    ("jobs", "jobs", str),
    ("finished", "finished", str),
    ("unfinished", "unfinished", str),
    ("failed (timeout)", "failed", str),
    ("wait avg", "wait_avg_s", _seconds),
    ("wait p50", "wait_p50_s", _seconds),
    ("wait p99", "wait_p99_s", _seconds),
    ("wait max", "wait_max_s", _seconds),
    ("JCT avg", "jct_avg_s", _seconds),
    ("JCT p50", "jct_p50_s", _seconds),
    ("JCT p99", "jct_p99_s", _seconds),
    ("GPU utilization", "utilization", _percent),
    ("makespan", "makespan_s", _seconds),
    ("preemptions", "preemptions", str),
    ("GPU-time lost to preemption", "lost_share", _percent),
    ("most restarts of one job", "restarts_max", _count),
    ("GPUs held while jobs wait", "utilization_while_waiting", _percent),
    ("free GPUs no waiting job fits", "fragmentation", _percent),
    ("guarantee violations", "guarantee_violations", _count),
    ("guarantee shortfall", "guarantee_shortfall_s", _seconds),
    ("fairness (Jain, slowdown)", "fairness_jain", _number),
    ("scheduling cycles", "cycles", str),
    ("replay wall time", "wall_s", _seconds),
)
FORECAST_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("forecasts (sampled jobs)", "forecast_samples", _count),
    ("forecast error p50", "forecast_error_median_s", _seconds),
    ("waits > 10 min (sampled)", "forecast_long_waits", _count),
    ("  forecast error p50 / wait", "forecast_long_error_median", _percent),
    ("  forecast error p90 / wait", "forecast_long_error_p90", _percent),
    ("forecast time", "forecast_s", _seconds),
)


def comparison_table(summaries: Sequence[dict[str, Any]], title: str) -> Table:
    """One column per policy, one row per metric."""
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for summary in summaries:
        table.add_column(summary["policy"], justify="right")
    rows = ROWS
    if any(s.get("instants_cut") for s in summaries):
        rows += (("instants cut short (livelock guard)", "instants_cut", _count),)
    if any("forecast_samples" in s for s in summaries):
        rows += FORECAST_ROWS
    for label, key, fmt in rows:
        table.add_row(label, *(fmt(s.get(key)) for s in summaries))
    return table


def per_queue_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"{summary['policy']}: per queue", title_justify="left")
    for column in ("queue", "jobs", "wait avg", "wait p99", "JCT avg", "util", "preempted"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for name, stats in summary["per_queue"].items():
        table.add_row(
            name,
            str(stats["jobs"]),
            _seconds(stats["wait_avg_s"]),
            _seconds(stats["wait_p99_s"]),
            _seconds(stats["jct_avg_s"]),
            _percent(stats["utilization"]),
            str(stats["preemptions"]),
        )
    return table
