"""Durations (``30s``, ``2h``, ``1d12h``) and weekly time windows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from allotment.domain.errors import InvalidQuantity

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

MAX_DURATION_S = 3650 * 86400.0
"""The longest duration anything may name (max_runtime, expected_runtime, backoffs, time
to live, ...): 3650 days, about 10 years."""


def parse_duration(value: object, *, name: str | None = None) -> float:
    """Parse ``90`` (seconds), ``30s``, ``15m``, ``2h``, ``1d12h`` into seconds, from 0 to
    :data:`MAX_DURATION_S` (3650 days)."""
    if isinstance(value, bool):
        raise InvalidQuantity(value, "expected a duration like 30s, 15m, 2h, 1d", name=name)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        elif text and _PART.sub("", text) == "":
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text))
        else:
            raise InvalidQuantity(value, "expected a duration like 30s, 15m, 2h, 1d12h", name=name)
    else:
        raise InvalidQuantity(value, "expected a duration like 30s, 15m, 2h, 1d", name=name)
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise InvalidQuantity(value, "must be a finite, non-negative duration", name=name)
    if seconds > MAX_DURATION_S:
        raise InvalidQuantity(
            value, "must be at most 3650d (about 10 years); give a shorter duration", name=name
        )
    return seconds


def format_duration(seconds: float) -> str:
    """``5400`` → ``1h30m``; for messages. Never raises: NaN reads ``unknown``, an
    infinity ``forever``, a negative duration is its size after a ``-``."""
    if seconds != seconds:
        return "unknown"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds == float("inf"):
        return "forever"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts[:2])


def _parse_clock(text: str) -> int:
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not match:
        raise InvalidQuantity(text, "expected a time of day like 08:00 or 20:30")
    hours, minutes = int(match.group(1)), int(match.group(2))
    if hours > 24 or minutes > 59 or (hours == 24 and minutes):
        raise InvalidQuantity(text, "hours 0-24 and minutes 0-59")
    return hours * 60 + minutes


def _parse_days(text: str) -> frozenset[int]:
    days: set[int] = set()
    for part in text.lower().replace(" ", "").split(","):
        if part in ("", "all", "daily", "*"):
            days.update(range(7))
            continue
        if "-" in part:
            first, last = part.split("-", 1)
            if first not in DAYS or last not in DAYS:
                raise InvalidQuantity(text, "days are mon..sun, ranges like mon-fri")
            i, j = DAYS.index(first), DAYS.index(last)
            while True:
                days.add(i)
                if i == j:
                    break
                i = (i + 1) % 7
        elif part in DAYS:
            days.add(DAYS.index(part))
        else:
            raise InvalidQuantity(text, "days are mon..sun, ranges like mon-fri")
    return frozenset(days)


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """Open on ``days`` from ``start`` to ``end`` minutes after midnight (UTC).

    A window whose end is before its start runs over midnight: ``mon-fri 20:00-08:00``
    is open from Monday 20:00 to Tuesday 08:00, ..., Friday 20:00 to Saturday 08:00.
    """

    days: frozenset[int]
    start: int
    end: int

    @classmethod
    def parse(cls, days: str, start: str, end: str) -> TimeWindow:
        return cls(days=_parse_days(days), start=_parse_clock(start), end=_parse_clock(end))

    def contains(self, at: float) -> bool:
        """Whether the window is open at ``at`` (seconds since the epoch, UTC)."""
        moment = datetime.fromtimestamp(at, tz=UTC)
        minute = moment.hour * 60 + moment.minute
        day = moment.weekday()
        if self.start <= self.end:
            return day in self.days and self.start <= minute < self.end
        if day in self.days and minute >= self.start:
            return True
        return (day - 1) % 7 in self.days and minute < self.end

    def next_open(self, at: float) -> float | None:
        """The first moment at or after ``at`` when the window is open (minute steps)."""
        if not self.days or self.start == self.end:
            return None
        base = int(at // 60) * 60
        for step in range(8 * 24 * 60 + 1):
            moment = base + step * 60
            if moment >= at and self.contains(moment):
                return float(moment)
        return None


def window_open(windows: tuple[TimeWindow, ...], at: float) -> bool:
    """No windows means always open; otherwise open when any window is."""
    return not windows or any(w.contains(at) for w in windows)


def next_window_open(windows: tuple[TimeWindow, ...], at: float) -> float | None:
    """The earliest opening of any window at or after ``at``."""
    if window_open(windows, at):
        return at
    opens = [t for t in (w.next_open(at) for w in windows) if t is not None]
    return min(opens) if opens else None
