"""The figures of a what-if (:mod:`allotment.sim.whatif`): the jobs and allocations of
a recording or a replay as :class:`Outcome`, their figures over a window
(:func:`figures`), the replay's fidelity against the recording (:func:`wait_error`,
:func:`order_agreement`) and what a proposal makes worse (:func:`worse`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allotment.domain.cluster import Cluster
from allotment.domain.history import RecordedJob
from allotment.domain.resources import GPU, MILLI
from allotment.sim.history import replay_jobs
from allotment.sim.metrics import mean, percentile
from allotment.sim.results import FAILED, PREEMPTED, SUCCEEDED, ReplayResult

WAIT_FLOOR_S = 1.0
"""Mean waits are compared against at least this: below it, a difference is the live
loop's own latency."""
WORSE_BY = 0.05
"""A figure is flagged worse when the proposal raises it by more than this share (and,
for times, by more than a second)."""
_FINISHED = (SUCCEEDED, FAILED)


@dataclass(frozen=True, slots=True)
class Story:
    """One job as it went, recorded or replayed."""

    queue: str
    submit: float
    first_start: float | None
    end: float | None
    """When it ended, if it ran to an end (succeeded or failed)."""
    preempted: int


@dataclass(frozen=True, slots=True)
class Hold:
    """One allocation: GPUs held from ``start`` to ``end`` (None: still held)."""

    queue: str
    start: float
    end: float | None
    gpus: int
    borrowed: int
    pool: str | None


@dataclass(slots=True)
class Outcome:
    """The jobs and allocations of one recording or replay, and the cluster it ran on."""

    stories: dict[str, Story]
    holds: list[Hold]
    cluster: Cluster
    violations: dict[str, int] | None = None


def recorded_outcome(
    recorded: Sequence[RecordedJob], cluster: Cluster, gpus: Mapping[str, int] | None = None
) -> Outcome:
    """What really happened, as far as the store knew; ``gpus``: each job's milli-GPUs
    (default: read from the jobs' specs)."""
    if gpus is None:
        gpus = {job.job_id: job.total_gpus for job in replay_jobs(recorded).jobs}
    stories: dict[str, Story] = {}
    holds: list[Hold] = []
    for job in recorded:
        end = None
        last = job.runs[-1] if job.runs else None
        if last is not None and last.released is not None and job.state in _FINISHED:
            end = last.released
        stories[job.id] = Story(
            job.queue,
            job.submit_time,
            job.first_admitted,
            end,
            sum(1 for r in job.runs if r.ended_as == PREEMPTED),
        )
        for run in job.runs:
            held_until = run.released if run.stopped is None else run.stopped
            holds.append(
                Hold(job.queue, run.admitted, held_until, gpus[job.id], run.borrowed_gpus, run.pool)
            )
    return Outcome(stories, holds, cluster)


def replayed_outcome(result: ReplayResult, cluster: Cluster, queues: Mapping[str, str]) -> Outcome:
    """A replay's jobs and allocations; ``queues`` maps each job to its queue."""
    stories = {
        job.job_id: Story(
            job.queue,
            job.submit,
            job.first_start,
            job.end if job.outcome in _FINISHED else None,
            job.preempted,
        )
        for job in result.jobs
    }
    pools = result.node_pools
    holds = [
        Hold(
            queues[a.job_id],
            a.start,
            a.end,
            a.gpus,
            a.borrowed,
            pools.get(a.nodes[0][0]) if a.nodes else None,
        )
        for a in result.attempts
        if a.start is not None
    ]
    violations: dict[str, int] | None = None
    if result.shortfalls is not None:
        violations = {}
        for shortfall in result.shortfalls:
            violations[shortfall.queue] = violations.get(shortfall.queue, 0) + 1
    return Outcome(stories, holds, cluster, violations)


def figures(
    outcome: Outcome,
    jobs: Iterable[str],
    *,
    since: float,
    until: float,
    holds_of: set[str] | None = None,
) -> dict[str, Any]:
    """The figures of ``jobs`` (ids) in ``outcome`` over the window; allocations counted
    for the queues in ``holds_of`` (None: every queue)."""
    waits: list[float] = []
    jcts: list[float] = []
    censored = preempted = submitted = 0
    for job_id in jobs:
        story = outcome.stories.get(job_id)
        if story is None or not since <= story.submit < until:
            continue
        submitted += 1
        preempted += story.preempted
        if story.first_start is None or story.first_start >= until:
            censored += 1
            waits.append(until - story.submit)
        else:
            waits.append(max(0.0, story.first_start - story.submit))
        if story.end is not None and story.end < until:
            jcts.append(story.end - story.submit)
    held = borrowed = cost = 0.0
    prices = {name: pool.price_per_gpu_hour for name, pool in outcome.cluster.pools.items()}
    for hold in outcome.holds:
        if holds_of is not None and hold.queue not in holds_of:
            continue
        start = max(hold.start, since)
        end = min(until if hold.end is None else hold.end, until)
        if end <= start:
            continue
        seconds = end - start
        held += hold.gpus * seconds
        borrowed += hold.borrowed * seconds
        cost += hold.gpus * seconds / MILLI / 3600.0 * prices.get(hold.pool or "", 0.0)
    total = fleet_gpus(outcome.cluster)
    span = until - since
    violations = None
    if outcome.violations is not None:
        queues = holds_of if holds_of is not None else set(outcome.violations)
        violations = sum(outcome.violations.get(q, 0) for q in queues)
    return {
        "jobs": submitted,
        "censored": censored,
        "wait_avg_s": _round(mean(waits)),
        "wait_p50_s": _round(percentile(waits, 50)),
        "wait_p95_s": _round(percentile(waits, 95)),
        "wait_p99_s": _round(percentile(waits, 99)),
        "jct_avg_s": _round(mean(jcts)),
        "preemptions": preempted,
        "guarantee_violations": violations,
        "gpu_hours": _round(held / MILLI / 3600.0),
        "utilization": _round(held / (total * span), 4) if total and span > 0 else None,
        "borrowed_gpu_hours": _round(borrowed / MILLI / 3600.0),
        "cost": _round(cost, 2),
    }


def fleet_gpus(cluster: Cluster) -> int:
    """Milli-GPUs of the healthy nodes."""
    return sum(n.capacity.get(GPU, 0) for n in cluster.nodes.values() if n.healthy)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def wait_error(recorded: float | None, replayed: float | None) -> float | None:
    """The relative error of a replayed mean wait against the recorded one."""
    if recorded is None or replayed is None:
        return None
    return round(abs(replayed - recorded) / max(recorded, WAIT_FLOOR_S), 4)


def order_agreement(recorded: Outcome, replayed: Outcome, jobs: Iterable[str]) -> float | None:
    """Spearman's rank correlation of first admissions over the jobs that started in
    both (None: fewer than three)."""
    pairs = []
    for job_id in jobs:
        a, b = recorded.stories.get(job_id), replayed.stories.get(job_id)
        if a and b and a.first_start is not None and b.first_start is not None:
            pairs.append((a.first_start, b.first_start))
    n = len(pairs)
    if n < 3:
        return None
    ranks_a = _ranks([p[0] for p in pairs])
    ranks_b = _ranks([p[1] for p in pairs])
    mean_rank = (n + 1) / 2
    cov = sum((x - mean_rank) * (y - mean_rank) for x, y in zip(ranks_a, ranks_b, strict=True))
    var_a = sum((x - mean_rank) ** 2 for x in ranks_a)
    var_b = sum((y - mean_rank) ** 2 for y in ranks_b)
    if not var_a or not var_b:
        return None
    return round(cov / math.sqrt(var_a * var_b), 4)


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


WORSE_LABELS = {
    "wait_avg_s": "mean wait",
    "wait_p50_s": "wait p50",
    "wait_p95_s": "wait p95",
    "wait_p99_s": "wait p99",
    "jct_avg_s": "mean JCT",
    "preemptions": "preemptions",
    "guarantee_violations": "guarantee violations",
}
"""The figures where less is better, as :func:`worse` names them."""


def got_worse(key: str, before: float | None, after: float | None) -> bool:
    """Whether figure ``key`` (one where less is better) grew from ``before`` to
    ``after`` by more than :data:`WORSE_BY`, and for a time by more than
    :data:`WAIT_FLOOR_S`."""
    if key not in WORSE_LABELS or before is None or after is None:
        return False
    if after <= before * (1 + WORSE_BY):
        return False
    return not (key.endswith("_s") and after - before < WAIT_FLOOR_S)


def worse(name: str, current: Mapping[str, Any], proposed: Mapping[str, Any]) -> list[str]:
    """What gets worse for ``name`` under the proposal, in words."""
    out = []
    for key, label in WORSE_LABELS.items():
        a, b = current.get(key), proposed.get(key)
        if a is None or b is None or not got_worse(key, a, b):
            continue
        change = f" (+{(b - a) / a:.0%})" if a else ""
        unit = " s" if key.endswith("_s") else ""
        out.append(f"{name}: {label} {a:g}{unit} -> {b:g}{unit}{change}")
    return out
