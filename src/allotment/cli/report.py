"""``allot report``: usage, waste and cost per group, waits, failures, preemptions and
reclaims, as tables, CSV, a self-contained HTML file, or JSON.

The CSV has one header and one row per group (:data:`CSV_COLUMNS`; the first column is
named after ``--by``). Numbers are written as the API sends them: GPU-hours, core-hours,
GiB-hours and cost with at most 6 decimals, so a column's sum is exact; the two ratios
are empty when undefined.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from allotment.cli.common import Output, OutputOption, console
from allotment.cli.live import TokenOption, UrlOption, connect
from allotment.domain.errors import InvalidInput


class Format(StrEnum):
    TABLE = "table"
    CSV = "csv"
    HTML = "html"


class By(StrEnum):
    TENANT = "tenant"
    QUEUE = "queue"
    POOL = "pool"
    USER = "user"
    TYPE = "type"


CSV_COLUMNS = (
    "jobs",
    "attempts",
    "allocated_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "unmeasured_gpu_hours",
    "measured_fraction",
    "utilization",
    "cpu_hours",
    "memory_gib_hours",
    "cost",
)
"""The CSV's columns after the group's key (named after ``--by``)."""


def number(value: Any) -> str:
    """A figure as the API sent it (``''`` for null)."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def csv_text(data: Mapping[str, Any]) -> str:
    """The usage rows as CSV: the key column (named after ``by``), then :data:`CSV_COLUMNS`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([str(data["by"]), *CSV_COLUMNS])
    for row in data["rows"]:
        writer.writerow([row["key"], *(number(row.get(c)) for c in CSV_COLUMNS)])
    return out.getvalue()


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def moment(at: float) -> str:
    """Seconds since the epoch as ``2026-11-30 08:00 UTC`` (the number itself when out of
    the calendar's range)."""
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, ValueError, OSError):
        return f"{at:g} s since the epoch"


@dataclass(frozen=True, slots=True)
class Section:
    """One table of the report: plain strings, escaped by whoever renders them."""

    title: str
    headers: tuple[str, ...]
    rows: list[list[str]]
    right: frozenset[int]
    """Indexes of the columns aligned right (numbers)."""


USAGE_HEADERS = (
    "jobs",
    "attempts",
    "GPU-h allocated",
    "GPU-h used",
    "GPU-h idle",
    "GPU-h unmeasured",
    "utilization",
    "measured",
    "CPU core-h",
    "memory GiB-h",
    "cost",
)


def _usage(row: Mapping[str, Any]) -> list[str]:
    return [
        str(row["key"]),
        str(row["jobs"]),
        str(row["attempts"]),
        f"{row['allocated_gpu_hours']:.2f}",
        f"{row['used_gpu_hours']:.2f}",
        f"{row['idle_gpu_hours']:.2f}",
        f"{row['unmeasured_gpu_hours']:.2f}",
        ratio(row.get("utilization")),
        ratio(row.get("measured_fraction")),
        f"{row['cpu_hours']:.2f}",
        f"{row['memory_gib_hours']:.2f}",
        f"{row['cost']:.2f}",
    ]


def sections(data: Mapping[str, Any]) -> list[Section]:
    """The report's tables: usage and cost, waits, failures, preemptions and reclaims."""
    by = str(data["by"])
    numbers = frozenset(range(1, len(USAGE_HEADERS) + 1))
    usage = [_usage(r) for r in data["rows"]]
    if usage:
        usage.append(_usage(data["total"]))
    waits = [
        [
            str(w["queue"]),
            str(w["priority_class"]),
            str(w["count"]),
            seconds(w["mean_s"]),
            seconds(w["p50_s"]),
            seconds(w["p95_s"]),
            seconds(w["max_s"]),
            str(w["waiting"]),
            seconds(w["waiting_max_s"]),
        ]
        for w in data["waits"]
    ]
    failures = [
        [f["failure_class"], f["pool"], f["queue"], f["type"], str(f["count"])]
        for f in data["failures"]
    ]
    stops = [[i["kind"], i["reason"], i["queue"], str(i["count"])] for i in data["interruptions"]]
    return [
        Section(f"usage and cost by {by}", (by, *USAGE_HEADERS), usage, numbers),
        Section(
            "wait times (submission or requeue to admission)",
            (
                "queue",
                "priority class",
                "admitted",
                "mean",
                "p50",
                "p95",
                "max",
                "waiting",
                "longest waiting",
            ),
            waits,
            frozenset(range(2, 9)),
        ),
        Section(
            "failures",
            ("failure class", "pool", "queue", "type", "count"),
            failures,
            frozenset({4}),
        ),
        Section(
            "preemptions and reclaims",
            ("kind", "reason", "queue", "count"),
            stops,
            frozenset({3}),
        ),
    ]


def title(data: Mapping[str, Any]) -> str:
    scope = f"tenant {data['tenant']}" if data.get("tenant") else "all tenants"
    return f"Allotment report, {moment(data['since'])} to {moment(data['until'])}, {scope}"


def rich_table(section: Section) -> Table:
    """A Rich table of ``section``; every cell is plain text (no markup)."""
    table = Table(title=section.title, title_justify="left")
    for i, header in enumerate(section.headers):
        table.add_column(header, justify="right" if i in section.right else "left")
    for row in section.rows:
        table.add_row(*(Text(cell) for cell in row))
    if not section.rows:
        table.add_row(*(Text("-" if i == 0 else "") for i in range(len(section.headers))))
    return table


def report(
    since: Annotated[
        str, typer.Option("--since", help="Start: a duration before --until (7d, 12h), or a time.")
    ] = "7d",
    until: Annotated[
        str | None,
        typer.Option("--until", help="End: an ISO 8601 time or epoch seconds; default now."),
    ] = None,
    by: Annotated[By, typer.Option("--by", help="Group usage and cost by this.")] = By.TENANT,
    fmt: Annotated[
        Format, typer.Option("--format", help="table, csv (usage rows), or html (with charts).")
    ] = Format.TABLE,
    jobs: Annotated[
        bool, typer.Option("--jobs", help="Include one record per job attempt (JSON, HTML).")
    ] = False,
    out: Annotated[
        str | None, typer.Option("--out", help="Write to this file instead of stdout.")
    ] = None,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Usage, waste and cost per tenant, queue, pool, user or job type; wait times,
    failures, preemptions and reclaims."""
    target = Path(out) if out is not None else None
    if target is not None and target.is_dir():
        raise InvalidInput(f"--out {out} is a directory; name a file", fields={"path": out})
    with connect(url, token) as client:
        data = client.report(since=since, until=until, by=by.value, jobs=jobs)
    if output is Output.JSON:
        _emit(json.dumps(data, indent=2) + "\n", target)
    elif fmt is Format.CSV:
        _emit(csv_text(data), target)
    elif fmt is Format.HTML:
        from allotment.cli.report_html import html_report

        _emit(html_report(data), target)
    else:
        from rich.console import Console

        buffer = io.StringIO()
        show = console() if target is None else Console(file=buffer, width=200, highlight=False)
        show.print(Text(title(data), style="bold"))
        for section in sections(data):
            show.print(rich_table(section))
        if target is not None:
            _emit(buffer.getvalue(), target)


def _emit(text: str, target: Path | None) -> None:
    if target is None:
        typer.echo(text, nl=False)
        return
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            f"cannot write {target}: {exc.strerror or exc}", fields={"path": str(target)}
        ) from None
    typer.echo(f"wrote {target}", err=True)


def register(app: typer.Typer) -> None:
    app.command(name="report")(report)
