"""Charts of replays (``allot sim --plot DIR``): PNG files drawn with matplotlib's Agg
canvas, one line or bar per policy.

- ``utilization.png``: the share of the cluster's GPUs held over replay time, as a
  time-weighted average over at most :data:`MAX_BINS` equal bins per policy.
- ``wait_cdf.png``: the cumulative distribution of queueing delay (first start - submit)
  over the jobs that started; log x-axis, waits under 1 s drawn at 1 s.
- ``queue_share.png``: per leaf queue, the GPUs it held on average over the replay next
  to its guarantee (nominal GPUs summed over pools), and the share of replay time it held
  less than its guarantee while it had jobs waiting.

The numbers behind the charts (:func:`utilization_bins`, :func:`queue_usage`) need no
matplotlib; it is imported only when a chart is drawn.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from allotment.domain.cluster import Cluster, Queue
from allotment.domain.errors import InvalidInput
from allotment.domain.resources import GPU, MILLI
from allotment.sim.results import PREEMPTED, Attempt, ReplayResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_BINS = 2000
"""Points per policy on the utilization chart, however long the trace."""

WAIT_FLOOR_S = 1.0
"""Waits shorter than this are drawn at this value on the log axis."""

DPI = 100
UTILIZATION_PNG = "utilization.png"
WAIT_CDF_PNG = "wait_cdf.png"
QUEUE_SHARE_PNG = "queue_share.png"
SIZES_PX: dict[str, tuple[int, int]] = {
    UTILIZATION_PNG: (1000, 500),
    WAIT_CDF_PNG: (1000, 500),
    QUEUE_SHARE_PNG: (1000, 700),
}
"""Width and height in pixels of each chart."""


@dataclass(frozen=True, slots=True)
class QueueUsage:
    """One leaf queue in one replay; GPUs in whole units."""

    queue: str
    held_avg: float
    """GPUs held on average over the replay span."""
    guarantee: float
    """Nominal GPUs, summed over the pools."""
    below_guarantee_share: float
    """Share of the replay span during which the queue held fewer GPUs than its
    guarantee while one of its jobs was waiting, for any reason (a request larger than
    the rest of the guarantee, a pool other than the guaranteed one, a closed time
    window): a sign to look closer, not a proof of a broken guarantee. 0 for a queue
    without a guarantee."""


def replay_span(result: ReplayResult) -> tuple[float, float] | None:
    """First submit and last end of a replay (the metrics' makespan), or None when
    nothing ended after the first submit."""
    ends = [a.end for a in result.attempts if a.end is not None]
    if not result.jobs or not ends:
        return None
    start = min(job.submit for job in result.jobs)
    end = max(ends)
    return (start, end) if end > start else None


def utilization_bins(
    attempts: Sequence[Attempt],
    total_gpus: int,
    *,
    start: float,
    end: float,
    bins: int = MAX_BINS,
) -> tuple[list[float], list[float]]:
    """The share of ``total_gpus`` (milli-GPUs) that ``attempts`` held, averaged over time
    in ``bins`` equal bins from ``start`` to ``end`` (seconds). Returns the ``bins + 1``
    bin edges and the ``bins`` averages; both empty when ``end <= start``."""
    if end <= start or bins < 1:
        return [], []
    changes: dict[float, int] = {}
    for attempt in attempts:
        if attempt.start is None or attempt.end is None or attempt.end <= attempt.start:
            continue
        changes[attempt.start] = changes.get(attempt.start, 0) + attempt.gpus
        changes[attempt.end] = changes.get(attempt.end, 0) - attempt.gpus
    times = sorted(changes)
    levels: list[int] = []
    integrals: list[float] = []
    level, integral, previous = 0, 0.0, 0.0
    for t in times:
        if levels:
            integral += level * (t - previous)
        level += changes[t]
        levels.append(level)
        integrals.append(integral)
        previous = t

    def held_until(t: float) -> float:
        """Milli-GPU-seconds held before ``t``."""
        i = bisect_right(times, t) - 1
        return 0.0 if i < 0 else integrals[i] + levels[i] * (t - times[i])

    edges = [start + (end - start) * k / bins for k in range(bins + 1)]
    cumulative = [held_until(t) for t in edges]
    values = []
    for k in range(bins):
        width = edges[k + 1] - edges[k]
        held = cumulative[k + 1] - cumulative[k]
        values.append(held / (width * total_gpus) if width > 0 and total_gpus > 0 else 0.0)
    return edges, values


def wait_cdf(result: ReplayResult, *, points: int = MAX_BINS) -> tuple[list[float], list[float]]:
    """The queueing delays of the jobs that started, ascending and floored at
    :data:`WAIT_FLOOR_S`, each with the share of started jobs that waited at most that
    long; at most ``points`` of them (evenly spaced ranks, the last always kept)."""
    waits = sorted(
        max(job.first_start - job.submit, WAIT_FLOOR_S)
        for job in result.jobs
        if job.first_start is not None
    )
    count = len(waits)
    if count <= points:
        ranks = list(range(count))
    else:
        ranks = sorted({round(k * (count - 1) / (points - 1)) for k in range(points)})
    return [waits[i] for i in ranks], [(i + 1) / count for i in ranks]


def _started(result: ReplayResult) -> int:
    return sum(1 for job in result.jobs if job.first_start is not None)


def guaranteed_gpus(queue: Queue) -> int:
    """A queue's nominal milli-GPUs, summed over the pools."""
    return sum(resources[GPU] for resources in queue.nominal.values())


def queue_usage(result: ReplayResult, cluster: Cluster) -> list[QueueUsage]:
    """Average GPUs held and time below guarantee with jobs waiting, per leaf queue that
    has a GPU guarantee or held GPUs, in the cluster's order. A job waits from its submit
    to its first start, from a preemption to its next start, and, when it never finished,
    until the end of the replay."""
    span = replay_span(result)
    leaves = cluster.leaves
    if span is None:
        return [
            QueueUsage(
                queue=q.name,
                held_avg=0.0,
                guarantee=guaranteed_gpus(q) / MILLI,
                below_guarantee_share=0.0,
            )
            for q in leaves
            if guaranteed_gpus(q) > 0
        ]
    first, last = span
    # Per queue: (instant, change in milli-GPUs held, change in jobs waiting).
    events: dict[str, list[tuple[float, int, int]]] = {}
    held_seconds: dict[str, float] = {}
    preempted_at = {
        (a.job_id, a.attempt): a.end
        for a in result.attempts
        if a.outcome == PREEMPTED and a.end is not None
    }
    for attempt in result.attempts:
        queue_events = events.setdefault(attempt.queue, [])
        since = attempt.submit
        if attempt.attempt > 1:
            since = preempted_at.get((attempt.job_id, attempt.attempt - 1), since)
        start, end = attempt.start, attempt.end
        until = last if start is None else start
        if until > since:
            queue_events.append((since, 0, 1))
            queue_events.append((until, 0, -1))
        if start is not None and end is not None and end > start:
            queue_events.append((start, attempt.gpus, 0))
            queue_events.append((end, -attempt.gpus, 0))
            held_seconds[attempt.queue] = held_seconds.get(attempt.queue, 0.0) + attempt.gpus * (
                end - start
            )

    usage: list[QueueUsage] = []
    for queue in leaves:
        guarantee = guaranteed_gpus(queue)
        held_total = held_seconds.get(queue.name, 0.0)
        if guarantee <= 0 and held_total <= 0:
            continue
        below = 0.0
        if guarantee > 0:
            held, waiting, since = 0, 0, first
            for t, held_change, waiting_change in sorted(events.get(queue.name, ())):
                if t > since and waiting > 0 and held < guarantee:
                    below += t - since
                held += held_change
                waiting += waiting_change
                since = t
        usage.append(
            QueueUsage(
                queue=queue.name,
                held_avg=held_total / (last - first) / MILLI,
                guarantee=guarantee / MILLI,
                below_guarantee_share=below / (last - first),
            )
        )
    return usage


def plot_directory(directory: Path) -> Path:
    """Create ``directory`` if missing; :class:`InvalidInput` if it cannot be one."""
    if directory.exists() and not directory.is_dir():
        raise InvalidInput(
            f"plot directory {directory} is a file, not a directory",
            fields={"path": str(directory)},
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(
            f"plot directory {directory} cannot be created: {exc.strerror or exc}",
            fields={"path": str(directory)},
        ) from None
    return directory


def write_plots(
    results: Sequence[tuple[str, ReplayResult]], cluster: Cluster, directory: Path
) -> list[Path]:
    """Draw the three charts of ``results`` (policy name, replay) into ``directory``
    (created if missing) and return their paths: utilization, wait CDF, queue share."""
    plot_directory(directory)
    charts = (
        (UTILIZATION_PNG, _utilization_figure(results)),
        (WAIT_CDF_PNG, _wait_cdf_figure(results)),
        (QUEUE_SHARE_PNG, _queue_share_figure(results, cluster)),
    )
    return [save_png(figure, directory / name) for name, figure in charts]


def save_png(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as a PNG at ``path``; :class:`InvalidInput` if it cannot be."""
    try:
        figure.savefig(path, format="png", dpi=DPI)
    except OSError as exc:
        raise InvalidInput(
            f"cannot write {path}: {exc.strerror or exc}", fields={"path": str(path)}
        ) from None
    return path


def _figure(name: str) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = SIZES_PX[name]
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _color(index: int) -> str:
    return f"C{index % 10}"


def _utilization_figure(results: Sequence[tuple[str, ReplayResult]]) -> Figure:
    figure = _figure(UTILIZATION_PNG)
    ax = figure.add_subplot()
    for index, (name, result) in enumerate(results):
        span = replay_span(result)
        if span is None:
            continue
        edges, values = utilization_bins(
            result.attempts, result.total_gpus, start=span[0], end=span[1]
        )
        ax.stairs(
            values, [t / 3600.0 for t in edges], label=name, color=_color(index), linewidth=1.2
        )
    ax.set_title("GPU utilization over the replay")
    ax.set_xlabel("replay time (hours)")
    ax.set_ylabel("GPUs held / total GPUs")
    ax.set_ylim(0.0, 1.05)
    ax.grid(True, alpha=0.3)
    _legend(ax, results)
    return figure


def _wait_cdf_figure(results: Sequence[tuple[str, ReplayResult]]) -> Figure:
    figure = _figure(WAIT_CDF_PNG)
    ax = figure.add_subplot()
    for index, (name, result) in enumerate(results):
        waits, shares = wait_cdf(result)
        if not waits:
            continue
        ax.step(
            [WAIT_FLOOR_S, *waits],
            [0.0, *shares],
            where="post",
            label=f"{name} ({_started(result)} started)",
            color=_color(index),
            linewidth=1.2,
        )
    ax.set_xscale("log")
    ax.set_title("Queueing delay (first start - submit), jobs that started")
    ax.set_xlabel(
        f"wait (s, log scale; waits under {WAIT_FLOOR_S:g} s drawn at {WAIT_FLOOR_S:g} s)"
    )
    ax.set_ylabel("share of started jobs")
    ax.set_ylim(0.0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, results)
    return figure


def _queue_share_figure(results: Sequence[tuple[str, ReplayResult]], cluster: Cluster) -> Figure:
    figure = _figure(QUEUE_SHARE_PNG)
    held_ax, below_ax = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    usages = [{u.queue: u for u in queue_usage(result, cluster)} for _, result in results]
    queues = [q.name for q in cluster.leaves if any(q.name in u for u in usages)]
    guarantees = {q.name: guaranteed_gpus(q) / MILLI for q in cluster.leaves}
    count = max(len(results), 1)
    width = 0.8 / count
    positions = list(range(len(queues)))
    for index, (name, _) in enumerate(results):
        offset = -0.4 + width * (index + 0.5)
        xs = [p + offset for p in positions]
        found = [usages[index].get(q) for q in queues]
        held = [u.held_avg if u is not None else 0.0 for u in found]
        below = [100.0 * u.below_guarantee_share if u is not None else 0.0 for u in found]
        held_ax.bar(xs, held, width, label=name, color=_color(index))
        below_ax.bar(xs, below, width, label=name, color=_color(index))
    if queues:
        held_ax.hlines(
            [guarantees[q] for q in queues],
            [p - 0.45 for p in positions],
            [p + 0.45 for p in positions],
            colors="black",
            linestyles="dashed",
            linewidth=1.5,
            label="guarantee (nominal GPUs)",
        )
    held_ax.set_title("GPUs held per queue, average over the replay, vs guarantee")
    held_ax.set_ylabel("GPUs")
    held_ax.grid(True, axis="y", alpha=0.3)
    below_ax.set_title("Time below guarantee while jobs of the queue waited (for any reason)")
    below_ax.set_ylabel("% of replay")
    below_ax.set_xlabel("leaf queue")
    below_ax.set_xticks(positions, queues, rotation=30, ha="right")
    below_ax.grid(True, axis="y", alpha=0.3)
    if queues:
        held_ax.legend(loc="best", fontsize="small")
    else:
        held_ax.text(
            0.5,
            0.5,
            "no queue held or was guaranteed GPUs",
            ha="center",
            transform=held_ax.transAxes,
        )
    return figure


def _legend(ax: Axes, results: Sequence[tuple[str, ReplayResult]]) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    elif results:
        ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
