"""Charts of a what-if (``allot whatif --plot DIR``), from the ``series`` of its answer:

- ``wait_cdf.png``: the distribution of waits, recorded, replayed in force and proposed
  (waits still open at the window's end count up to it); log x-axis, waits under a
  second drawn at a second;
- ``utilization.png``: the share of the fleet's GPUs held over the window, the same three;
- ``queue_waits.png``: the mean wait per queue, the same three side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from allotment.sim.plots import DPI, WAIT_FLOOR_S, plot_directory, save_png

LABELS = {"recorded": "recorded", "current": "replayed in force", "proposed": "proposed"}
COLORS = {"recorded": "C7", "current": "C0", "proposed": "C3"}


def write_whatif_plots(data: Mapping[str, Any], directory: Path) -> list[Path]:
    """Draw the three charts into ``directory``; return their paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plot_directory(directory)
    series: Mapping[str, Any] = data["series"]
    written: list[Path] = []

    def save(name: str, figure: Figure) -> None:
        written.append(save_png(figure, directory / name))

    def figure(width: int, height: int) -> Figure:
        made = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
        FigureCanvasAgg(made)
        return made

    cdf = figure(1000, 500)
    ax = cdf.add_subplot()
    for name, points in series.items():
        quantiles = points["wait_quantiles"]
        if quantiles:
            ax.plot(
                [max(w, WAIT_FLOOR_S) for _, w in quantiles],
                [q for q, _ in quantiles],
                label=LABELS.get(name, name),
                color=COLORS.get(name),
            )
    ax.set_xscale("log")
    ax.set_title("waits (first admission - submit)")
    ax.set_xlabel("wait (s)")
    ax.set_ylabel("share of jobs")
    ax.grid(True, alpha=0.3)
    ax.legend()
    save("wait_cdf.png", cdf)

    use = figure(1000, 500)
    ax = use.add_subplot()
    for name, points in series.items():
        values = points["utilization"]
        width = points["bin_s"] / 3600.0
        ax.stairs(
            values,
            [i * width for i in range(len(values) + 1)],
            label=LABELS.get(name, name),
            color=COLORS.get(name),
        )
    ax.set_title("GPUs held / the fleet's GPUs")
    ax.set_xlabel("hours since the window's start")
    ax.set_ylim(0.0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend()
    save("utilization.png", use)

    bars = figure(1000, 600)
    ax = bars.add_subplot()
    queues = data["queues"]
    names = [k for k in ("recorded", "current", "proposed") if queues and queues[0].get(k)]
    step = 0.8 / max(len(names), 1)
    for i, key in enumerate(names):
        ax.bar(
            [q + i * step for q in range(len(queues))],
            [row[key]["wait_avg_s"] or 0.0 for row in queues],
            width=step,
            label=LABELS[key],
            color=COLORS[key],
        )
    ax.set_xticks([q + 0.4 - step / 2 for q in range(len(queues))])
    ax.set_xticklabels([row["name"] for row in queues], rotation=30, ha="right")
    ax.set_ylabel("mean wait (s)")
    ax.set_title("mean wait per queue")
    ax.legend()
    save("queue_waits.png", bars)
    return written
