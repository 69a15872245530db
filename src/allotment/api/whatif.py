"""``/whatif`` and ``/history/export``: recorded history replayed under a proposed
configuration, and exported as a trace.

Both read the jobs recorded over a window (:mod:`allotment.store.history`). The what-if
replays them on the whole fleet (:func:`allotment.sim.whatif.compare`), under the
versions of the cluster file in force at the time (each run on the executor's nodes,
as the live cluster is) and under the proposal; a tenant admin then sees the rows of
its own tenant's queues only, never the fleet's totals or another tenant's queues.
"""

from __future__ import annotations

from typing import Any

from allotment.accounting.report import parse_window
from allotment.api.auth import Principal
from allotment.api.policy import visible_tenant
from allotment.api.service import JobService
from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.domain.tenancy import DEFAULT_TENANT
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.sim.history import trace_csv
from allotment.sim.policies import parse_policy
from allotment.sim.whatif import compare, workers_for
from allotment.store.history import config_versions, recorded_jobs

PROPOSED = "proposed.yaml"


def whatif(
    svc: JobService,
    who: Principal,
    *,
    text: str | None,
    since: str,
    until: str | None,
    policy: str | None,
    series: bool,
) -> dict[str, Any]:
    """The comparison (see :func:`allotment.sim.whatif.compare`), scoped to ``who``.
    Without ``text`` only the configuration in force is replayed (its fidelity)."""
    window = parse_window(since, until, now=svc.clock())
    chosen = parse_policy(policy) if policy else (svc.policy or SchedulerPolicy())
    proposed = None
    if text is not None:
        proposed = svc.state.resolve(load_cluster_text(text, source=PROPOSED))
    with svc.sessions() as session:
        recorded = recorded_jobs(session, since=window.since, until=window.until)
        versions = config_versions(session, until=window.until)
    in_force: list[tuple[float, Cluster]] = [
        (v.applied_at, svc.state.resolve(load_cluster_text(v.text, source=f"version {v.version}")))
        for v in versions
    ] or [(0.0, svc.cluster)]
    tenant = visible_tenant(who)
    visible = None
    if tenant is not None:
        visible = {
            name
            for name, queue in svc.cluster.queues.items()
            if (queue.tenant or DEFAULT_TENANT) == tenant
        }
    out = compare(
        recorded,
        since=window.since,
        until=window.until,
        in_force=in_force,
        proposed=proposed,
        policy=chosen,
        series=series,
        visible=visible,
        workers=workers_for(len(recorded)),
    )
    out["versions"] = [v.version for v in versions]
    if tenant is None:
        return out
    out["queues"] = [q for q in out["queues"] if q["tenant"] == tenant]
    out["tenants"] = [t for t in out["tenants"] if t["name"] == tenant]
    out["total"] = None
    out["jobs"] = sum(q["recorded"]["jobs"] for q in out["queues"])
    out["replayed_jobs"] = None
    # The fleet's counts say how much other tenants ran: only the loop's timings stay.
    out["assumed"] = {
        key: value if key.endswith("_s") else None for key, value in out["assumed"].items()
    }
    out["worse"] = [w for r in (*out["queues"], *out["tenants"]) for w in r["worse"]]
    errors = [q["wait_error"] for q in out["queues"] if q["wait_error"] is not None]
    out["fidelity"] = {
        "target": out["fidelity"]["target"],
        "wait_error": None,
        "order_agreement": None,
        "worst_queue_error": max(errors, default=None),
    }
    return out


def history_export(
    svc: JobService, who: Principal, *, since: str, until: str | None, users: bool = False
) -> tuple[str, int]:
    """The trace CSV of the window's jobs that ``who`` may see (with ``users``, a column
    of pseudonyms telling whose jobs are the same person's), and how many were left out
    because they never completed a run."""
    window = parse_window(since, until, now=svc.clock())
    with svc.sessions() as session:
        recorded = recorded_jobs(session, since=window.since, until=window.until)
    tenant = visible_tenant(who)
    if tenant is not None:
        recorded = [job for job in recorded if (job.tenant or DEFAULT_TENANT) == tenant]
    return trace_csv(recorded, since=window.since, users=users)
