"""``GET /report``: the accounting report as wire schemas."""

from __future__ import annotations

import math

from sqlalchemy.orm import Session, sessionmaker

from allotment.accounting.figures import AttemptRecord, Group, from_micro
from allotment.accounting.report import Report, build_report, parse_window
from allotment.accounting.waits import WaitStats
from allotment.api import schemas
from allotment.domain.cluster import Cluster


def usage_row(group: Group) -> schemas.UsageRow:
    f = group.figures
    return schemas.UsageRow(
        key=group.key,
        jobs=len(group.jobs),
        attempts=group.attempts,
        allocated_gpu_hours=from_micro(f.allocated),
        used_gpu_hours=from_micro(f.used),
        idle_gpu_hours=from_micro(f.idle),
        unmeasured_gpu_hours=from_micro(f.unmeasured),
        measured_fraction=f.measured / f.allocated if f.allocated else None,
        utilization=f.used / f.measured if f.measured else None,
        cpu_hours=from_micro(f.cpu),
        memory_gib_hours=from_micro(f.memory),
        cost=from_micro(f.cost),
        interrupted_gpu_hours=from_micro(f.interrupted),
    )


def attempt_usage(record: AttemptRecord) -> schemas.AttemptUsage:
    item, f = record.input, record.figures
    return schemas.AttemptUsage(
        job=item.job,
        attempt=item.attempt,
        tenant=item.tenant,
        queue=item.queue,
        pool=item.pool,
        user=item.user,
        type=item.type,
        priority_class=item.priority_class,
        state=item.state,
        failure_class=item.failure_class,
        held_from=record.held_from,
        held_until=record.held_until,
        open=record.open,
        seconds=record.seconds,
        gpus=record.gpus,
        price_per_gpu_hour=record.price,
        allocated_gpu_hours=from_micro(f.allocated),
        used_gpu_hours=from_micro(f.used),
        idle_gpu_hours=from_micro(f.idle),
        unmeasured_gpu_hours=from_micro(f.unmeasured),
        cpu_hours=from_micro(f.cpu),
        memory_gib_hours=from_micro(f.memory),
        cost=from_micro(f.cost),
        interrupted_gpu_hours=from_micro(f.interrupted),
    )


def wait_row(s: WaitStats) -> schemas.WaitRow:
    return schemas.WaitRow(
        queue=s.queue,
        priority_class=s.priority_class,
        count=s.count,
        mean_s=s.mean_s,
        p50_s=s.p50_s,
        p95_s=s.p95_s,
        max_s=s.max_s,
        waiting=s.waiting,
        waiting_max_s=s.waiting_max_s,
    )


def report_out(report: Report, *, tenant: str | None, records: bool) -> schemas.ReportOut:
    return schemas.ReportOut(
        since=report.window.since,
        until=report.window.until,
        by=report.by,
        tenant=tenant,
        rows=[usage_row(g) for g in report.rows],
        total=usage_row(report.total),
        cost_by_tenant=[usage_row(g) for g in report.cost_by_tenant],
        waits=[wait_row(s) for s in report.waits],
        waits_total=wait_row(report.waits_total),
        wait_histogram=[
            schemas.WaitBin(label=label, upper_s=upper if math.isfinite(upper) else None, count=n)
            for label, upper, n in report.wait_histogram
        ],
        failures=[
            schemas.FailureRow(failure_class=c, pool=p, queue=q, type=t, count=n)
            for (c, p, q, t), n in report.failures
        ],
        interruptions=[
            schemas.InterruptionRow(kind=k, reason=r, queue=q, count=n)
            for (k, r, q), n in report.interruptions
        ],
        timeline=[
            schemas.TimelinePoint(
                start=b.start,
                end=b.end,
                allocated_gpus=b.allocated,
                measured_gpus=b.measured,
                used_gpus=b.used,
            )
            for b in report.timeline
        ],
        records=[attempt_usage(r) for r in report.records] if records else None,
    )


def usage_report(
    sessions: sessionmaker[Session],
    cluster: Cluster,
    *,
    since: str,
    until: str | None,
    by: str,
    tenant: str | None,
    records: bool,
    now: float,
) -> schemas.ReportOut:
    """The report of ``since``..``until`` (see
    :func:`~allotment.accounting.report.parse_window`) grouped ``by``, over ``tenant``'s
    jobs (``None``: all), priced with ``cluster``'s pools (a pool no longer configured
    costs 0). Raises ``InvalidInput`` (422) for a bad window or grouping."""
    window = parse_window(since, until, now=now)
    pools = cluster.pools

    def price_of(pool: str) -> float:
        found = pools.get(pool)
        return found.price_per_gpu_hour if found is not None else 0.0

    with sessions() as session:
        report = build_report(session, window, by=by, tenant=tenant, price_of=price_of, now=now)
    return report_out(report, tenant=tenant, records=records)
