"""The report as people read it, from the API's ``/report`` answer (plain data in, text
out): its tables (:func:`sections`), its title, and its CSV. Shared by ``allot report``
and the dashboard's reports page, so both show the same figures.

The CSV has one header and one row per group (:data:`CSV_COLUMNS`; the first column is
named after the grouping). Numbers are written as the API sends them: GPU-hours,
core-hours, GiB-hours and cost with at most 6 decimals, so a column's sum is exact; the
two ratios are empty when undefined.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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
    "interrupted_gpu_hours",
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
    "GPU-h interrupted",
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
        f"{row['interrupted_gpu_hours']:.2f}",
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
