"""Quality metrics of a replay, overall and per queue (the ``allot sim`` summary).

- ``wait``: first start - submit, over jobs that started.
- ``jct`` (job completion time): final end - submit, over finished jobs (``succeeded`` or
  ``failed`` by timeout; never ``unfinished``).
- ``utilization``: GPU-seconds allocated / (total GPUs x makespan). Per queue, the same
  denominator, so the queues' utilizations add up to the total.
- ``makespan_s``: last end - first submit (per queue: of that queue's jobs).
- ``preemptions``: attempts that ended preempted (per queue: of that queue's jobs).
- ``lost_gpu_hours``: the GPU-hours of those attempts, work thrown away (a preempted job
  starts again from scratch; ``gpu_hours`` includes it), and ``lost_share`` its share of
  ``gpu_hours``; ``restarts_max``: the most times one job was preempted (churn: a job
  that can run only by borrowing, taken back again and again).
- ``guarantee_violations``: how many times a queue was owed its guarantee after a cycle
  (its first waiting job fitted in its unused nominal quota of a pool where other queues
  held part of it) -- every one lasted beyond the cycle that should have reclaimed it;
  ``guarantee_shortfall_s`` and ``guarantee_shortfall_max_s`` their total and longest
  duration. None when the scheduler ran as a snapshot function (not tracked).
- ``owed_waits``: jobs that waited more than five minutes, in all, while their queue
  held no more than its nominal GPUs minus theirs (:mod:`allotment.sim.owed`); an
  outside checker's count, stricter than ``guarantee_violations``.
- ``wait_max_s``: the longest wait (no job starving).
- ``instants_cut``: instants the replay left before their cycles settled (its guard
  against a livelock was reached): 0 in a faithful replay.
- ``forecast_*`` (with ``predict_every``): start forecasts made at submission against
  the actual starts (see :func:`forecast_stats`).
- ``fairness_jain``: Jain's index (sum x)^2 / (n*sum x^2) over the queues' mean *bounded
  slowdown*, x = (wait + run) / max(run, 10 s) per finished job: 1.0 when every queue is
  slowed down alike, 1/n when one queue bears it all. ``None`` per queue and when no queue
  finished a job.
- Percentiles interpolate linearly between ranks (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from allotment.domain.resources import MILLI
from allotment.sim.owed import owed_waits
from allotment.sim.results import (
    FAILED,
    SUCCEEDED,
    UNFINISHED,
    Attempt,
    JobResult,
    ReplayResult,
    Shortfall,
)

SLOWDOWN_FLOOR_S = 10.0
"""Runs shorter than this count as this long in bounded slowdown."""

SUMMARY_FIELDS = (
    "jobs",
    "jct_avg_s",
    "jct_p50_s",
    "jct_p99_s",
    "wait_avg_s",
    "wait_p50_s",
    "wait_p99_s",
    "utilization",
    "makespan_s",
    "preemptions",
    "guarantee_violations",
    "fairness_jain",
    "wall_s",
)
"""The summary fields the README lists, in order; the summary adds a few more after them."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` with linear interpolation; None if
    empty. ``values`` need not be sorted."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def jain(values: Iterable[float]) -> float | None:
    """Jain's fairness index of ``values``; None if empty, 1.0 if all are zero."""
    xs = list(values)
    if not xs:
        return None
    square_sum = sum(x * x for x in xs)
    if square_sum == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * square_sum)


def _finished(job: JobResult) -> bool:
    return job.outcome in (SUCCEEDED, FAILED) and job.end is not None


def _slowdown(job: JobResult) -> float:
    assert job.end is not None and job.first_start is not None
    run = max(job.duration, 0.0)
    jct = job.end - job.submit
    return jct / max(run, SLOWDOWN_FLOOR_S)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _group(jobs: Sequence[JobResult], *, total_gpus: int, span: float | None) -> dict[str, Any]:
    """Stats of ``jobs``; utilization over ``span`` seconds (None: their own makespan)."""
    waits = [j.first_start - j.submit for j in jobs if j.first_start is not None]
    jcts = [j.end - j.submit for j in jobs if _finished(j) and j.end is not None]
    ends = [j.end for j in jobs if j.end is not None]
    own_span = (max(ends) - min(j.submit for j in jobs)) if jobs and ends else None
    denominator_span = own_span if span is None else span
    gpu_seconds = sum(j.gpu_seconds for j in jobs)
    lost = sum(j.lost_gpu_seconds for j in jobs)
    utilization = None
    if denominator_span and total_gpus:
        utilization = gpu_seconds / (total_gpus * denominator_span)
    return {
        "jobs": len(jobs),
        "jct_avg_s": _round(mean(jcts)),
        "jct_p50_s": _round(percentile(jcts, 50)),
        "jct_p99_s": _round(percentile(jcts, 99)),
        "wait_avg_s": _round(mean(waits)),
        "wait_p50_s": _round(percentile(waits, 50)),
        "wait_p99_s": _round(percentile(waits, 99)),
        "wait_max_s": _round(max(waits, default=None)),
        "utilization": _round(utilization, 4),
        "makespan_s": _round(own_span),
        "preemptions": sum(j.preempted for j in jobs),
        "guarantee_violations": None,
        "finished": sum(1 for j in jobs if _finished(j)),
        "failed": sum(1 for j in jobs if j.outcome == FAILED),
        "unfinished": sum(1 for j in jobs if j.outcome == UNFINISHED),
        "gpu_hours": _round(gpu_seconds / MILLI / 3600.0),
        "lost_gpu_hours": _round(lost / MILLI / 3600.0),
        "lost_share": _round(lost / gpu_seconds, 4) if gpu_seconds else None,
        "restarts_max": max((j.preempted for j in jobs), default=0),
    }


def _shortfalls(stats: dict[str, Any], shortfalls: Sequence[Shortfall] | None) -> None:
    if shortfalls is None:
        return
    stats["guarantee_violations"] = len(shortfalls)
    stats["guarantee_shortfall_s"] = _round(sum(s.end - s.start for s in shortfalls))
    stats["guarantee_shortfall_max_s"] = _round(
        max((s.end - s.start for s in shortfalls), default=0.0)
    )


LONG_WAIT_S = 600.0
"""Forecasts are judged on the jobs that waited longer than this."""


def forecast_stats(jobs: Sequence[JobResult]) -> dict[str, Any]:
    """How good the start forecasts made at submission were (``predict_every``): over the
    sampled jobs that started, the error |forecast - actual start|; relative to the
    actual wait for those that waited longer than :data:`LONG_WAIT_S`. Empty when no job
    was sampled."""
    sampled = [j for j in jobs if j.sampled and j.first_start is not None]
    if not any(j.sampled for j in jobs):
        return {}
    errors: list[float] = []
    relative: list[float] = []
    missing = long_waits = 0
    for job in sampled:
        assert job.first_start is not None
        wait = job.first_start - job.submit
        if wait > LONG_WAIT_S:
            long_waits += 1
        if job.predicted_start is None:
            missing += 1
            continue
        error = abs(job.predicted_start - job.first_start)
        errors.append(error)
        if wait > LONG_WAIT_S:
            relative.append(error / wait)
    return {
        "forecast_samples": len(sampled),
        "forecast_none": missing,
        "forecast_error_median_s": _round(percentile(errors, 50)),
        "forecast_long_waits": long_waits,
        "forecast_long_error_median": _round(percentile(relative, 50), 4),
        "forecast_long_error_p90": _round(percentile(relative, 90), 4),
        "forecast_long_within_25pct": (
            _round(sum(1 for r in relative if r <= 0.25) / len(relative), 4) if relative else None
        ),
    }


def contention_stats(result: ReplayResult) -> dict[str, Any]:
    """While some job waited: the share of GPUs held (``utilization_while_waiting``), the
    average free GPUs that no waiting job could use (``fragmented_gpus``; looked at about
    2,000 times over the replay, against the first 16 waiting jobs of each queue) and
    their share of the free GPUs (``fragmentation``); and per pool, the jobs that waited
    before they started there (``per_pool``). Empty when no job ever waited."""
    if not result.waiting_s or not result.total_gpus:
        return {}
    capacity = result.total_gpus * result.waiting_s
    free = capacity - result.held_while_waiting
    per_pool: dict[str, dict[str, Any]] = {}
    first: dict[str, Attempt] = {}
    for attempt in result.attempts:
        if attempt.start is not None and attempt.job_id not in first:
            first[attempt.job_id] = attempt
    for attempt in first.values():
        pool = result.node_pools.get(attempt.nodes[0][0], "?") if attempt.nodes else "?"
        assert attempt.start is not None
        waited = attempt.start - attempt.submit
        stats = per_pool.setdefault(pool, {"started": 0, "waited": 0, "wait_total_s": 0.0})
        stats["started"] += 1
        if waited > 0:
            stats["waited"] += 1
            stats["wait_total_s"] += waited
    for name in sorted(per_pool):
        stats = per_pool[name]
        total = stats.pop("wait_total_s")
        stats["wait_avg_s"] = _round(total / stats["waited"]) if stats["waited"] else 0.0
    never = sum(1 for j in result.jobs if j.first_start is None)
    return {
        "contended_s": _round(result.waiting_s),
        "utilization_while_waiting": _round(result.held_while_waiting / capacity, 4),
        "fragmented_gpus": _round(result.unusable_while_waiting / result.waiting_s / MILLI, 2),
        "fragmentation": _round(result.unusable_while_waiting / free, 4) if free > 0 else None,
        "never_started": never,
        "per_pool": {name: per_pool[name] for name in sorted(per_pool)},
    }


def summarize(result: ReplayResult) -> dict[str, Any]:
    """The summary of one replay: the fields the README lists, a few more (``finished``,
    ``failed``, ``unfinished``, ``gpu_hours``, ``lost_gpu_hours``, ``lost_share``,
    ``restarts_max``, ``cycles``, ``instants_cut``, ``scheduler_s``), and ``per_queue``
    with the same fields per queue (``fairness_jain`` and ``wall_s`` are None there)."""
    jobs = result.jobs
    overall = _group(jobs, total_gpus=result.total_gpus, span=None)
    makespan = overall["makespan_s"]
    owed = owed_waits(jobs, result.attempts, result.nominal_gpus)
    by_queue: dict[str, list[JobResult]] = {}
    for job in jobs:
        by_queue.setdefault(job.queue, []).append(job)
    per_queue: dict[str, dict[str, Any]] = {}
    slowdowns: list[float] = []
    for name in sorted(by_queue):
        queue_jobs = by_queue[name]
        stats = _group(queue_jobs, total_gpus=result.total_gpus, span=makespan)
        finished = [_slowdown(j) for j in queue_jobs if _finished(j)]
        if finished:
            slowdowns.append(sum(finished) / len(finished))
        stats["slowdown_avg"] = _round(mean(finished))
        stats["owed_waits"] = owed.get(name, 0)
        if result.shortfalls is not None:
            _shortfalls(stats, [s for s in result.shortfalls if s.queue == name])
        stats["fairness_jain"] = None
        stats["wall_s"] = None
        per_queue[name] = _ordered(stats)
    overall["fairness_jain"] = _round(jain(slowdowns), 4)
    _shortfalls(overall, result.shortfalls)
    overall["owed_waits"] = owed[""]
    overall["wall_s"] = _round(result.wall_s)
    overall["cycles"] = result.cycles
    overall["instants_cut"] = result.instants_cut
    overall["scheduler_s"] = _round(result.scheduler_s)
    overall.update(forecast_stats(jobs))
    overall.update(contention_stats(result))
    if result.forecast_s:
        overall["forecast_s"] = _round(result.forecast_s)
    return {"policy": result.policy.name, **_ordered(overall), "per_queue": per_queue}


def _ordered(stats: dict[str, Any]) -> dict[str, Any]:
    head = {key: stats.get(key) for key in SUMMARY_FIELDS}
    head.update({k: v for k, v in stats.items() if k not in head})
    return head
