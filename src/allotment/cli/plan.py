"""``allot plan``: what one scheduling cycle would decide for some job files.

Runs the real core on an empty cluster (every node free) with the given jobs submitted
in order, and reports each job's decision with its placement, or its reason and
estimated start.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from allotment.domain.cluster import Cluster
from allotment.domain.job import JobSpec
from allotment.domain.resources import format_quantity
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.eta import estimate_starts
from allotment.scheduler.snapshot import SchedulerPolicy, Snapshot, pending_from_spec


def plan(
    cluster: Cluster,
    jobs: Sequence[tuple[str, JobSpec]],
    *,
    now: float,
    policy: SchedulerPolicy | None = None,
) -> list[dict[str, Any]]:
    """One row per job: ``job``, ``queue``, ``decision`` (admitted / preempting / waiting),
    ``pool`` and ``placements`` when admitted, else ``reason`` and ``estimated_start``."""
    pending = [
        pending_from_spec(name, spec, cluster, submit_time=now - len(jobs) + i)
        for i, (name, spec) in enumerate(jobs)
    ]
    snapshot = Snapshot(
        now=now, cluster=cluster, pending=pending, policy=policy or SchedulerPolicy()
    )
    decisions = schedule_once(snapshot)
    estimates = estimate_starts(snapshot) if decisions.waiting else {}
    admits = {a.job: a for a in decisions.admitted}
    preempting = {p.job for p in decisions.preemptions}
    rows = []
    for job in pending:
        row: dict[str, Any] = {
            "job": job.id,
            "queue": job.queue,
            "position": decisions.position(job.id, job.queue),
        }
        admit = admits.get(job.id)
        if admit is not None:
            row["decision"] = "admitted"
            row["pool"] = admit.pool
            row["placements"] = [
                {
                    "replica": f"{p.group}-{p.index}",
                    "node": p.node,
                    "devices": list(p.devices),
                    "resources": {k: format_quantity(k, v) for k, v in p.resources.items() if v},
                }
                for p in admit.placements
            ]
            row["borrowed"] = {k: format_quantity(k, v) for k, v in admit.borrowed.items()}
        else:
            reason = decisions.waiting[job.id]
            row["decision"] = "preempting" if job.id in preempting else "waiting"
            row["reason"] = reason.to_dict()
            start = estimates.get(job.id)
            row["estimated_start"] = None if start is None else _iso(start)
        rows.append(row)
    return rows


def _iso(at: float) -> str:
    try:
        return datetime.fromtimestamp(at, tz=UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"{at:g} s since the epoch"


def plan_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="one scheduling cycle on an empty cluster")
    for column in ("job", "queue", "decision", "where / why", "estimated start"):
        table.add_column(column)
    for row in rows:
        if row["decision"] == "admitted":
            where = "; ".join(
                f"{p['node']} gpu {','.join(map(str, p['devices'])) or '-'}"
                for p in row["placements"]
            )
            detail = f"{row['pool']}: {where}"
            start = "now"
        else:
            detail = f"[bold]{row['reason']['code']}[/]: {row['reason']['message']}"
            start = row["estimated_start"] or "unknown"
        table.add_row(row["job"], row["queue"], row["decision"], detail, start)
    return table
