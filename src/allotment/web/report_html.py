"""``allot report --format html``: one self-contained HTML file (inline CSS, charts as
base64 PNG drawn with matplotlib's Agg canvas, no external assets), every text that
came from users escaped.

Charts: GPUs allocated, measured and used over the window; cost by tenant; the
wait-time distribution; failures by class.
"""

from __future__ import annotations

import base64
import io
from collections import Counter
from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from allotment.web.report import Section, moment, number, sections, title

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f3f3f3; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: bold; }
.charts img { max-width: 100%; margin: 0.5em 0; }
p.note, dl { font-size: 0.9em; color: #444; max-width: 60em; }
dt { font-weight: bold; margin-top: 0.4em; }
"""

DEFINITIONS = (
    (
        "allocated GPU-hours",
        "GPUs held x hours held within the window (admission to the end "
        "of the last replica; open attempts count up to the window's end).",
    ),
    (
        "used GPU-hours",
        "allocated GPUs x hours x measured utilisation, over the time covered "
        "by utilisation samples.",
    ),
    ("idle GPU-hours", "measured GPU-hours - used GPU-hours."),
    ("unmeasured GPU-hours", "allocated GPU-hours not covered by any utilisation sample."),
    ("utilization", "used / (used + idle); measured: (used + idle) / allocated."),
    ("cost", "allocated GPU-hours x the pool's price per GPU-hour."),
)


def _figure(width: int, height: int) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _png(figure: Figure, alt: str) -> str:
    import matplotlib

    buffer = io.BytesIO()
    with matplotlib.rc_context({"text.parse_math": False}):
        figure.savefig(buffer, format="png", dpi=DPI)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{encoded}">'


def utilization_chart(timeline: Sequence[Mapping[str, Any]], since: float) -> str:
    figure = _figure(1000, 380)
    ax = figure.add_subplot()
    if timeline:
        edges = [(p["start"] - since) / 3600 for p in timeline] + [
            (timeline[-1]["end"] - since) / 3600
        ]
        for key, label in (
            ("allocated_gpus", "allocated"),
            ("measured_gpus", "measured"),
            ("used_gpus", "used"),
        ):
            ax.stairs([p[key] for p in timeline], edges, label=label, linewidth=1.4)
        ax.legend(loc="upper left")
    ax.set_title("GPUs over the window (averages per interval)")
    ax.set_xlabel(f"hours since {moment(since)}")
    ax.set_ylabel("GPUs")
    ax.grid(True, alpha=0.3)
    return _png(figure, "GPUs allocated, measured and used over the window")


def _bars(labels: Sequence[str], values: Sequence[float], heading: str, unit: str) -> Figure:
    figure = _figure(1000, max(200, 60 + 28 * len(labels)))
    ax = figure.add_subplot()
    ax.barh(list(range(len(labels))), list(values), color="C0")
    ax.set_yticks(list(range(len(labels))), labels=list(labels))
    ax.invert_yaxis()
    ax.set_title(heading)
    ax.set_xlabel(unit)
    ax.grid(True, axis="x", alpha=0.3)
    return figure


def cost_chart(rows: Sequence[Mapping[str, Any]]) -> str:
    labels = [str(r["key"]) for r in rows]
    return _png(
        _bars(labels, [r["cost"] for r in rows], "cost by tenant", "cost"), "cost by tenant"
    )


def wait_chart(bins: Sequence[Mapping[str, Any]]) -> str:
    figure = _figure(1000, 320)
    ax = figure.add_subplot()
    ax.bar([str(b["label"]) for b in bins], [b["count"] for b in bins], color="C1")
    ax.set_title("wait-time distribution (waits ended by an admission)")
    ax.set_ylabel("waits")
    ax.grid(True, axis="y", alpha=0.3)
    return _png(figure, "wait-time distribution")


def failure_chart(failures: Sequence[Mapping[str, Any]]) -> str:
    per_class: Counter[str] = Counter()
    for row in failures:
        per_class[str(row["failure_class"])] += int(row["count"])
    ordered = per_class.most_common()
    return _png(
        _bars([k for k, _ in ordered], [v for _, v in ordered], "failures by class", "attempts"),
        "failures by class",
    )


def table_html(section: Section, *, total_last: bool = False) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in section.headers)
    body: list[str] = []
    for index, row in enumerate(section.rows):
        cells = "".join(
            f'<td class="n">{escape(c)}</td>' if i in section.right else f"<td>{escape(c)}</td>"
            for i, c in enumerate(row)
        )
        last = total_last and index == len(section.rows) - 1
        body.append(f'<tr class="total">{cells}</tr>' if last else f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(section.headers)}">none</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


RECORD_COLUMNS = (
    "job",
    "attempt",
    "tenant",
    "queue",
    "pool",
    "user",
    "type",
    "state",
    "gpus",
    "seconds",
    "allocated_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "unmeasured_gpu_hours",
    "interrupted_gpu_hours",
    "cost",
)


def records_html(records: Sequence[Mapping[str, Any]]) -> str:
    rows = [[number(r.get(c)) for c in RECORD_COLUMNS] for r in records]
    section = Section(
        "per attempt", RECORD_COLUMNS, rows, frozenset(range(8, len(RECORD_COLUMNS))) | {1}
    )
    return table_html(section)


def report_body(data: Mapping[str, Any]) -> str:
    """The report ``data`` (as ``GET /report`` answers) as HTML to place in a page's body:
    its tables and charts, and the definitions of its figures (no title)."""
    usage, waits, failures, stops = sections(data)
    parts = [
        f"<h2>{escape(usage.title)}</h2>",
        table_html(usage, total_last=bool(usage.rows)),
        '<div class="charts">',
        utilization_chart(data["timeline"], float(data["since"])),
        cost_chart(data["cost_by_tenant"]),
        "</div>",
        f"<h2>{escape(waits.title)}</h2>",
        table_html(waits),
        '<div class="charts">',
        wait_chart(data["wait_histogram"]),
        "</div>",
        f"<h2>{escape(failures.title)}</h2>",
        table_html(failures),
        '<div class="charts">',
        failure_chart(data["failures"]),
        "</div>",
        f"<h2>{escape(stops.title)}</h2>",
        table_html(stops),
    ]
    if data.get("records") is not None:
        parts += ["<h2>per attempt</h2>", records_html(data["records"])]
    parts.append("<h2>definitions</h2><dl>")
    parts += [f"<dt>{escape(t)}</dt><dd>{escape(d)}</dd>" for t, d in DEFINITIONS]
    parts.append("</dl>")
    return "\n".join(parts)


def html_report(data: Mapping[str, Any]) -> str:
    """The report ``data`` (as ``GET /report`` answers) as one HTML document."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title(data))}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{escape(title(data))}</h1>",
        report_body(data),
        "</body></html>\n",
    ]
    return "\n".join(parts)
