"""The usage repository: per-interval aggregates in ``job_usage`` and ``device_usage``.

One row per (job, attempt, interval start) and per (node, device, interval start),
upserted as samples arrive: the sampler is the only writer (it runs on the leading
server alone), so a read-then-write per key is safe. Functions flush, never commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session

from allotment.store.models import DeviceUsage, JobUsage
from allotment.telemetry.aggregate import Aggregate, JobSample, fold
from allotment.telemetry.sources import DeviceReading


def _job_aggregate(row: JobUsage) -> Aggregate:
    return Aggregate(
        samples=row.samples,
        util_avg=row.gpu_util_avg,
        util_max=row.gpu_util_max,
        gpu_memory_max=row.gpu_memory_max,
        cpu_avg=row.cpu_avg,
        memory_max=row.memory_max,
    )


def add_job_samples(
    db: Session, samples: Sequence[JobSample], *, start: float, length: float
) -> None:
    """Fold one instant's samples into their interval's rows (created when absent)."""
    if not samples:
        return
    keys = [(s.job_id, s.attempt) for s in samples]
    existing = {
        (row.job_id, row.attempt): row
        for row in db.scalars(
            select(JobUsage).where(
                JobUsage.interval_start == start,
                tuple_(JobUsage.job_id, JobUsage.attempt).in_(keys),
            )
        )
    }
    for sample in samples:
        row = existing.get((sample.job_id, sample.attempt))
        merged = fold(
            None if row is None else _job_aggregate(row),
            util=sample.gpu_util,
            util_peak=sample.gpu_util_peak,
            gpu_memory=sample.gpu_memory,
            cpu=sample.cpu,
            memory=sample.memory,
        )
        if row is None:
            row = JobUsage(
                job_id=sample.job_id,
                attempt=sample.attempt,
                interval_start=start,
                interval_s=length,
            )
            db.add(row)
        row.samples = merged.samples
        row.gpus = sample.gpus
        row.gpu_util_avg = merged.util_avg
        row.gpu_util_max = merged.util_max
        row.gpu_memory_max = merged.gpu_memory_max
        row.cpu_avg = merged.cpu_avg
        row.memory_max = merged.memory_max
    db.flush()


def add_device_readings(
    db: Session, readings: Sequence[DeviceReading], *, start: float, length: float
) -> None:
    """Fold one instant's device readings into their interval's rows."""
    if not readings:
        return
    keys = [(r.node, r.device) for r in readings]
    existing = {
        (row.node, row.device): row
        for row in db.scalars(
            select(DeviceUsage).where(
                DeviceUsage.interval_start == start,
                tuple_(DeviceUsage.node, DeviceUsage.device).in_(keys),
            )
        )
    }
    for reading in readings:
        row = existing.get((reading.node, reading.device))
        old = (
            None
            if row is None
            else Aggregate(
                samples=row.samples,
                util_avg=row.util_avg,
                util_max=row.util_max,
                gpu_memory_max=row.memory_max,
            )
        )
        merged = fold(old, util=reading.utilization, gpu_memory=reading.memory_used)
        if row is None:
            row = DeviceUsage(
                node=reading.node, device=reading.device, interval_start=start, interval_s=length
            )
            db.add(row)
            existing[(reading.node, reading.device)] = row
        row.samples = merged.samples
        row.util_avg = merged.util_avg
        row.util_max = merged.util_max
        row.memory_max = merged.gpu_memory_max
    db.flush()


def prune_usage(db: Session, *, before: float) -> int:
    """Delete the rows of intervals that ended before ``before``; return how many."""
    removed = 0
    for table in (JobUsage, DeviceUsage):
        result = db.execute(delete(table).where(table.interval_start + table.interval_s < before))
        removed += int(getattr(result, "rowcount", 0) or 0)
    return removed


def job_usage_rows(
    db: Session, keys: Iterable[tuple[str, int]], *, since: float
) -> dict[tuple[str, int], list[JobUsage]]:
    """The rows of each ``(job, attempt)`` whose interval ends after ``since``, oldest
    first."""
    wanted = list(keys)
    out: dict[tuple[str, int], list[JobUsage]] = {k: [] for k in wanted}
    if not wanted:
        return out
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        query = (
            select(JobUsage)
            .where(
                tuple_(JobUsage.job_id, JobUsage.attempt).in_(chunk),
                JobUsage.interval_start + JobUsage.interval_s > since,
            )
            .order_by(JobUsage.interval_start)
        )
        for row in db.scalars(query):
            out[(row.job_id, row.attempt)].append(row)
    return out
