"""One report over a window: usage and cost per group, waits, failures, preemptions and
reclaims, and a utilisation timeline; and the parsing of its window."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from allotment.accounting import source
from allotment.accounting.figures import (
    GROUPINGS,
    AttemptRecord,
    Bucket,
    Group,
    Window,
    group,
    records_for,
    timeline,
    total,
)
from allotment.accounting.waits import WaitStats, histogram, stats, stats_by_queue, waits
from allotment.domain.durations import parse_duration
from allotment.domain.errors import InvalidInput, InvalidQuantity
from allotment.domain.lifecycle import JobState

TIMELINE_BUCKETS = 96
"""Points of the utilisation timeline, whatever the window's length."""

MAX_WINDOW_S = 366 * 86400.0
"""The longest window one report covers."""

MIN_WINDOW_S = 1.0
"""The shortest window one report covers (its timeline cuts it into ``TIMELINE_BUCKETS``)."""

LATEST_TIME_S = 253402300799.0
"""The latest time a report may name: 9999-12-31T23:59:59Z (times are seconds since the
epoch, from 0)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    window: Window
    by: str
    records: list[AttemptRecord]
    rows: list[Group]
    total: Group
    cost_by_tenant: list[Group]
    waits: list[WaitStats]
    waits_total: WaitStats
    wait_histogram: list[tuple[str, float, int]]
    failures: list[tuple[tuple[str, str, str, str], int]]
    """``((failure_class, pool, queue, type), count)``, most frequent first."""
    interruptions: list[tuple[tuple[str, str, str], int]]
    """``((kind, reason, queue), count)``, most frequent first."""
    timeline: list[Bucket]


def build_report(
    session: Session,
    window: Window,
    *,
    by: str,
    tenant: str | None,
    price_of: Callable[[str], float],
    now: float | None = None,
) -> Report:
    """The report of ``window`` grouped ``by`` a key of
    :data:`~allotment.accounting.figures.GROUPINGS`, over ``tenant``'s jobs (``None``:
    all); ``price_of(pool)`` is a pool's price per GPU-hour. Open attempts count up to
    the window's end, or ``now`` when earlier."""
    if by not in GROUPINGS:
        raise InvalidInput(
            f"cannot group a report by {by!r}; use one of: {', '.join(GROUPINGS)}",
            fields={"by": by, "allowed": list(GROUPINGS)},
        )
    items = source.attempts(session, window, tenant)
    records = records_for(items, window, price_of, now=now)
    history = source.histories(session, window, tenant)
    found = waits(history.moves, history.labels, window)
    failures: Counter[tuple[str, str, str, str]] = Counter()
    for item in items:
        ended = item.end if item.end is not None else item.start
        if item.state == JobState.FAILED.value and window.since <= ended < window.until:
            failures[(item.failure_class or "unknown", item.pool, item.queue, item.type)] += 1
    stopped = Counter(
        (i.kind, i.reason, i.queue) for i in source.interruptions(session, window, tenant)
    )
    return Report(
        window=window,
        by=by,
        records=records,
        rows=group(records, by),
        total=total(records),
        cost_by_tenant=group(records, "tenant"),
        waits=stats_by_queue(found, window),
        waits_total=stats(found, window, queue=None, priority_class=None),
        wait_histogram=histogram(found),
        failures=sorted(failures.items(), key=lambda kv: (-kv[1], kv[0])),
        interruptions=sorted(stopped.items(), key=lambda kv: (-kv[1], kv[0])),
        timeline=timeline(records, window, TIMELINE_BUCKETS),
    )


_NUMBER = re.compile(r"^\s*\d+(\.\d+)?\s*$")


def parse_time(text: str, *, name: str) -> float:
    """An ISO 8601 date or time (UTC unless it names a zone) or seconds since the
    epoch; :class:`InvalidInput` naming ``name`` otherwise."""
    value = text.strip()
    if _NUMBER.match(value):
        seconds = float(value)
    else:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise InvalidInput(
                f"{name} {text!r} is not a time: give an ISO 8601 date or time "
                "(2026-11-30, 2026-11-30T08:00:00Z) or seconds since the epoch",
                fields={"name": name, "value": text},
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = moment.timestamp()
    if not (math.isfinite(seconds) and 0 <= seconds <= LATEST_TIME_S):
        raise InvalidInput(
            f"{name} {text!r} is out of range: give a time from 1970-01-01 to "
            "9999-12-31T23:59:59Z (0 to 253402300799 seconds since the epoch)",
            fields={"name": name, "value": text, "min": 0, "max": LATEST_TIME_S},
        )
    return seconds


def parse_window(since: str, until: str | None, *, now: float) -> Window:
    """The window ``[since, until)``: ``until`` a time (:func:`parse_time`) or ``now``;
    ``since`` a duration before ``until`` (``7d``, ``12h``, ``90`` seconds) or a time.
    Raises :class:`InvalidInput` naming the parameter when either cannot be read or lies
    outside 1970..9999, when ``since`` is not before ``until``, or when the window spans
    less than a second or more than 366 days."""
    end = now if until is None or not until.strip() else parse_time(until, name="until")
    text = since.strip()
    if re.fullmatch(r"\d{4}-.*", text):
        start = parse_time(text, name="since")
    else:
        try:
            start = end - parse_duration(text, name="since")
        except InvalidQuantity as exc:
            raise InvalidInput(
                f"since {since!r} is neither a duration (7d, 12h, 30m) nor an ISO 8601 "
                "date or time (2026-11-30T08:00:00Z)",
                fields={"name": "since", "value": since},
            ) from exc
    if not start < end:
        raise InvalidInput(
            f"the report's start (since={since!r}) must be before its end (until={until!r})",
            fields={"since": start, "until": end},
        )
    if end - start > MAX_WINDOW_S:
        raise InvalidInput(
            "a report spans at most 366 days: narrow since/until",
            fields={"since": start, "until": end, "min_s": MIN_WINDOW_S, "max_s": MAX_WINDOW_S},
        )
    if end - start < MIN_WINDOW_S:
        raise InvalidInput(
            f"a report spans at least {MIN_WINDOW_S:g} second (and at most 366 days): "
            f"widen since/until (since={since!r}, until={until!r})",
            fields={"since": start, "until": end, "min_s": MIN_WINDOW_S, "max_s": MAX_WINDOW_S},
        )
    return Window(since=start, until=end)
