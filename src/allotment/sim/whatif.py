"""What-if: replay recorded history under the configuration in force and under a
proposed one, and compare them side by side with what really happened.

:func:`compare` runs the real scheduler twice over the same recorded jobs
(:func:`allotment.sim.history.replay_jobs`) on the real clock: once under the versions
of the cluster file that were in force (each from the instant it was applied), once
under the proposal for the whole period. It measures, per queue, per tenant and over
the fleet, the same figures for the recording and both replays, all over the window
``[since, until)``:

- waits (first admission - submit) of the jobs submitted in the window; a job not
  started by ``until`` counts with ``until - submit`` (a lower bound: *censored*, not
  dropped), and ``censored`` says how many;
- JCT over the jobs that ended by ``until``; preemptions; GPU-hours held, utilisation
  (held / the fleet's GPUs over the window), borrowed GPU-hours and cost (GPU-hours at
  each pool's price), counting every allocation's part inside the window;
- guarantee violations (replays only; the recording does not say).

**Fidelity first**: the replay of the configuration in force is compared with the
recording: per queue the relative error of the mean wait (against at least
:data:`~allotment.sim.whatif_figures.WAIT_FLOOR_S`, the live loop's own latency), over
the fleet the same, and the agreement of the admission order (Spearman's rank
correlation over the jobs that started in both). Every prediction is shown with its
queue's error. The figures themselves are in :mod:`allotment.sim.whatif_figures`.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from bisect import bisect_right
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from allotment.domain.cluster import Cluster
from allotment.domain.errors import InvalidInput
from allotment.domain.history import RecordedJob
from allotment.domain.tenancy import DEFAULT_TENANT
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.sim.history import replay_jobs
from allotment.sim.replay import Replay
from allotment.sim.results import ReplayResult
from allotment.sim.trace import TraceJob
from allotment.sim.whatif_figures import (
    Outcome,
    figures,
    fleet_gpus,
    order_agreement,
    recorded_outcome,
    replayed_outcome,
    wait_error,
    worse,
)

TARGET_ERROR = 0.15
"""The fidelity the replay aims for: the in-force replay's mean wait per queue within
15% of the recorded one."""

LIMITS = (
    "users would have submitted differently under another configuration (more, fewer or "
    "other jobs, at other times); the replay repeats what they did",
    "each run takes as long as it took; a run moved to another pool is not faster or slower",
    "jobs that never completed a run in the window run as long as they declared, else "
    "their queue's median run",
    "preempted runs are left out (the replay preempts by its own rules and a preempted "
    "job starts over); failed runs are retried at once, without the live back-off",
)


def _fit(job: TraceJob, cluster: Cluster) -> tuple[TraceJob | None, bool]:
    """``job`` as ``cluster`` can take it (None: its queue is not a leaf there), and
    whether its priority class, not allowed there, became the queue's default."""
    queue = cluster.queues.get(job.queue)
    if queue is None or not queue.is_leaf:
        return None, False
    if cluster.priority_class_for(queue, job.priority_class) is None:
        return replace(job, priority_class=None), True
    return job, False


def fit_jobs(
    jobs: Sequence[TraceJob], cluster: Cluster, *, source: str
) -> tuple[list[TraceJob], int]:
    """The jobs as ``cluster`` can take them: a priority class it does not allow in a
    job's queue becomes that queue's default (counted). Raises :class:`InvalidInput`
    naming every queue of the jobs that it lacks or that has child queues."""
    fitted: list[TraceJob] = []
    missing: dict[str, int] = {}
    moved = 0
    for job in jobs:
        fit, reset = _fit(job, cluster)
        if fit is None:
            missing[job.queue] = missing.get(job.queue, 0) + 1
            continue
        fitted.append(fit)
        moved += reset
    if missing:
        named = ", ".join(
            f"{q!r} ({n} job{'s' if n != 1 else ''})" for q, n in sorted(missing.items())
        )
        leaves = ", ".join(sorted(q.name for q in cluster.leaves)) or "none"
        raise InvalidInput(
            f"{source} has no leaf queue for recorded jobs of {named}: keep those queues "
            f"(its leaf queues: {leaves})",
            fields={"queues": sorted(missing)},
        )
    return fitted, moved


def fit_in_force(
    jobs: Sequence[TraceJob], versions: Sequence[tuple[float, Cluster]]
) -> tuple[list[TraceJob], int]:
    """The jobs as the version in force at each one's submission takes it; a job whose
    queue was no leaf then (a history older than the stored versions) is left out, and
    counted."""
    ordered = sorted(versions, key=lambda v: v[0])
    times = [at for at, _ in ordered]
    fitted: list[TraceJob] = []
    left_out = 0
    for job in jobs:
        cluster = ordered[max(0, bisect_right(times, job.submit_time) - 1)][1]
        fit, _ = _fit(job, cluster)
        if fit is None:
            left_out += 1
        else:
            fitted.append(fit)
    return fitted, left_out


PARALLEL_FROM = 20_000
"""From this many recorded jobs, the two replays run in two processes where the machine
has two cores: starting a process costs about a second, a replay of 20,000 jobs more."""


def workers_for(jobs: int) -> int:
    """How many processes the replays of ``jobs`` recorded jobs should use."""
    return 2 if jobs >= PARALLEL_FROM and (os.cpu_count() or 1) > 1 else 1


@dataclass(frozen=True, slots=True)
class _Run:
    """One replay of a comparison (a picklable unit of work)."""

    name: str
    cluster: Cluster
    jobs: list[TraceJob]
    policy: SchedulerPolicy
    until: float
    changes: list[tuple[float, Cluster]]
    stop_latency: float
    end_latency: float
    turn: float


def _replay(run: _Run) -> ReplayResult | None:
    if not run.jobs:
        return None
    return Replay(
        run.cluster,
        run.jobs,
        run.policy,
        until=run.until,
        changes=run.changes,
        stop_latency=run.stop_latency,
        end_latency=run.end_latency,
        turn=run.turn,
    ).run()


def _in_force(
    versions: Sequence[tuple[float, Cluster]], start: float, until: float
) -> tuple[Cluster, list[tuple[float, Cluster]]]:
    """The version in force at ``start`` (the oldest when none was applied yet) and the
    later ones applied before ``until``."""
    ordered = sorted(versions, key=lambda v: v[0])
    first = ordered[0][1]
    for at, cluster in ordered:
        if at <= start:
            first = cluster
    return first, [(at, c) for at, c in ordered if start < at < until]


def compare(
    recorded: Sequence[RecordedJob],
    *,
    since: float,
    until: float,
    in_force: Sequence[tuple[float, Cluster]],
    proposed: Cluster | None,
    policy: SchedulerPolicy,
    series: bool = False,
    visible: set[str] | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """Replay ``recorded`` under the versions ``in_force`` (when each was applied, the
    cluster) and under ``proposed`` (None: only the first), and compare them with the
    recording over ``[since, until)`` (see the module's docstring). ``series`` adds
    chart data over the jobs and allocations of the ``visible`` queues (None: all).
    ``workers`` > 1 runs the two replays in that many processes at once."""
    if not in_force:
        raise ValueError("no configuration in force")
    began = time.perf_counter()
    trace = replay_jobs(recorded)
    queue_of = {job.id: job.queue for job in recorded}
    tenant_of: dict[str, str] = {}
    for job in recorded:
        tenant_of.setdefault(job.queue, job.tenant or DEFAULT_TENANT)
    start = min((job.submit_time for job in trace.jobs), default=since)
    first, changes = _in_force(in_force, start, until)
    latest = sorted(in_force, key=lambda v: v[0])[-1][1]
    gpus = {job.job_id: job.total_gpus for job in trace.jobs}
    outcomes: dict[str, Outcome] = {"recorded": recorded_outcome(recorded, latest, gpus)}
    current_jobs, left_out = fit_in_force(trace.jobs, in_force)
    moved = 0
    proposed_jobs: list[TraceJob] = []
    if proposed is not None:
        proposed_jobs, moved = fit_jobs(trace.jobs, proposed, source="the proposed file")
    timings = (trace.stop_latency, trace.end_latency, trace.turn)
    runs = [_Run("current", first, current_jobs, policy, until, changes, *timings)]
    if proposed is not None:
        runs.append(
            _Run(
                "proposed",
                proposed,
                proposed_jobs,
                policy,
                until,
                [],
                *timings,
            )
        )
    if workers > 1 and len(runs) > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(runs)), mp_context=context) as pool:
            results = list(pool.map(_replay, runs))
    else:
        results = [_replay(run) for run in runs]
    for run, result in zip(runs, results, strict=True):
        final = run.changes[-1][1] if run.changes else run.cluster
        outcomes[run.name] = (
            replayed_outcome(result, final, queue_of)
            if result is not None
            else Outcome({}, [], final, {})
        )
    window = [job.id for job in recorded if since <= job.submit_time < until]
    by_queue: dict[str, list[str]] = {}
    for job_id in window:
        by_queue.setdefault(queue_of[job_id], []).append(job_id)
    by_tenant: dict[str, list[str]] = {}
    for queue, ids in by_queue.items():
        by_tenant.setdefault(tenant_of[queue], []).extend(ids)

    def row(name: str, ids: list[str], queues: set[str] | None) -> dict[str, Any]:
        data: dict[str, Any] = {"name": name}
        for key, outcome in outcomes.items():
            data[key] = figures(outcome, ids, since=since, until=until, holds_of=queues)
        data.setdefault("proposed", None)
        data["wait_error"] = wait_error(
            data["recorded"]["wait_avg_s"], data["current"]["wait_avg_s"]
        )
        data["worse"] = worse(name, data["current"], data["proposed"]) if data["proposed"] else []
        return data

    queues = [
        {**row(queue, ids, {queue}), "tenant": tenant_of[queue]}
        for queue, ids in sorted(by_queue.items())
    ]
    tenants = [
        row(tenant, ids, {q for q, t in tenant_of.items() if t == tenant})
        for tenant, ids in sorted(by_tenant.items())
    ]
    total = row("fleet", window, None)
    out: dict[str, Any] = {
        "since": since,
        "until": until,
        "policy": policy.name,
        "jobs": len(window),
        "replayed_jobs": len(trace.jobs),
        "assumed": {
            "estimated_runs": trace.estimated,
            "open_runs": trace.open_runs,
            "withdrawn": trace.withdrawn,
            "default_priority_class": moved,
            "unknown_queue": left_out,
            "turn_s": round(trace.turn, 3),
            "end_latency_s": round(trace.end_latency, 3),
            "stop_latency_s": round(trace.stop_latency, 3),
        },
        "fidelity": {
            "target": TARGET_ERROR,
            "wait_error": total["wait_error"],
            "order_agreement": order_agreement(outcomes["recorded"], outcomes["current"], window),
            "worst_queue_error": max(
                (q["wait_error"] for q in queues if q["wait_error"] is not None), default=None
            ),
        },
        "queues": queues,
        "tenants": tenants,
        "total": total,
        "worse": [w for r in (*queues, *tenants, total) for w in r["worse"]],
        "limits": list(LIMITS),
        "replay_s": round(time.perf_counter() - began, 3),
    }
    if series:
        shown = [j for j in window if visible is None or queue_of[j] in visible]
        out["series"] = {
            name: _series(outcome, shown, since=since, until=until, queues=visible)
            for name, outcome in outcomes.items()
        }
    return out


SERIES_POINTS = 200
"""Points per curve in ``series``."""


def _series(
    outcome: Outcome,
    jobs: Sequence[str],
    *,
    since: float,
    until: float,
    queues: set[str] | None,
) -> dict[str, Any]:
    """The wait distribution (quantiles) of ``jobs`` and the share of the fleet's GPUs
    that ``queues`` held over the window (None: all), in :data:`SERIES_POINTS` points
    each, for charts."""
    waits = sorted(
        (until if s.first_start is None else min(s.first_start, until)) - s.submit
        for s in (outcome.stories.get(j) for j in jobs)
        if s is not None
    )
    quantiles = []
    if waits:
        for i in range(SERIES_POINTS + 1):
            q = i / SERIES_POINTS
            quantiles.append([round(q, 4), round(waits[round(q * (len(waits) - 1))], 3)])
    width = (until - since) / SERIES_POINTS
    held = [0.0] * SERIES_POINTS
    for hold in outcome.holds:
        if queues is not None and hold.queue not in queues:
            continue
        start = max(hold.start, since)
        end = min(until if hold.end is None else hold.end, until)
        first = int((start - since) // width)
        while start < end and first < SERIES_POINTS:
            edge = min(end, since + (first + 1) * width)
            held[first] += hold.gpus * (edge - start)
            start, first = edge, first + 1
    total = fleet_gpus(outcome.cluster)
    usage = [round(h / (total * width), 4) if total else 0.0 for h in held]
    return {"wait_quantiles": quantiles, "utilization": usage, "bin_s": width}
