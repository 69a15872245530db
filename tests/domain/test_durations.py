"""Durations and weekly time windows (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allotment.domain.durations import (
    TimeWindow,
    format_duration,
    next_window_open,
    parse_duration,
    window_open,
)
from allotment.domain.errors import InvalidQuantity


def at(day: str, clock: str, second: int = 0) -> float:
    """A moment in the week of Monday 2024-01-01 (UTC): ``at("tue", "03:00")``."""
    index = ("mon", "tue", "wed", "thu", "fri", "sat", "sun", "mon2").index(day)
    hours, minutes = (int(p) for p in clock.split(":"))
    return datetime(2024, 1, 1 + index, hours, minutes, second, tzinfo=UTC).timestamp()


def test_helper_week_starts_on_monday() -> None:
    assert datetime.fromtimestamp(at("mon", "00:00"), tz=UTC).weekday() == 0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        (0, 0.0),
        ("90", 90.0),
        ("2.5", 2.5),
        ("30s", 30.0),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1w", 604800.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("1d12h", 129600.0),
        ("1h30m", 5400.0),
        (" 1h 30m ", 5400.0),
        ("2m30s", 150.0),
    ],
)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        "",
        "abc",
        "1x",
        "5 minutes",
        "1h30",
        "h",
        "-5",
        "-5s",
        -5,
        -0.1,
        True,
        False,
        None,
        float("nan"),
        float("inf"),
        [1],
        "1.5.2h",
        "3651d",  # more than 10 years
        "3000000d",
        10 * 366 * 86400,
    ],
)
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(InvalidQuantity):
        parse_duration(value, name="max_runtime")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (5400, "1h30m"), (90061, "1d1h"), (7200, "2h")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


OFFICE = TimeWindow.parse("mon-fri", "09:00", "17:00")
NIGHTLY = TimeWindow.parse("mon-fri", "20:00", "08:00")
WEEKEND = TimeWindow.parse("sat-sun", "00:00", "24:00")
LONG_WEEKEND = TimeWindow.parse("fri-mon", "00:00", "24:00")  # a range that wraps


@pytest.mark.parametrize(
    ("window", "moment", "open_"),
    [
        pytest.param(OFFICE, at("mon", "09:00"), True, id="office-opens"),
        pytest.param(OFFICE, at("mon", "08:59"), False, id="office-before"),
        pytest.param(OFFICE, at("wed", "16:59", 59), True, id="office-last-second"),
        pytest.param(OFFICE, at("fri", "17:00"), False, id="office-closes"),
        pytest.param(OFFICE, at("sat", "10:00"), False, id="office-saturday"),
        pytest.param(NIGHTLY, at("mon", "20:00"), True, id="nightly-opens-monday"),
        pytest.param(NIGHTLY, at("mon", "19:59"), False, id="nightly-monday-evening"),
        pytest.param(NIGHTLY, at("tue", "03:00"), True, id="nightly-after-midnight"),
        pytest.param(NIGHTLY, at("tue", "07:59"), True, id="nightly-last-minute"),
        pytest.param(NIGHTLY, at("tue", "08:00"), False, id="nightly-closes"),
        pytest.param(NIGHTLY, at("mon", "03:00"), False, id="nightly-monday-morning-closed"),
        pytest.param(NIGHTLY, at("sat", "07:59"), True, id="nightly-friday-spills-saturday"),
        pytest.param(NIGHTLY, at("sat", "08:00"), False, id="nightly-saturday-8am"),
        pytest.param(NIGHTLY, at("sat", "21:00"), False, id="nightly-saturday-evening"),
        pytest.param(NIGHTLY, at("sun", "02:00"), False, id="nightly-sunday-night"),
        pytest.param(WEEKEND, at("sat", "00:00"), True, id="weekend-saturday-midnight"),
        pytest.param(WEEKEND, at("sun", "23:59", 59), True, id="weekend-sunday-end"),
        pytest.param(WEEKEND, at("mon2", "00:00"), False, id="weekend-over"),
        pytest.param(WEEKEND, at("fri", "23:59"), False, id="weekend-not-yet"),
        pytest.param(LONG_WEEKEND, at("sun", "12:00"), True, id="wrap-range-sunday"),
        pytest.param(LONG_WEEKEND, at("mon", "12:00"), True, id="wrap-range-monday"),
        pytest.param(LONG_WEEKEND, at("wed", "12:00"), False, id="wrap-range-wednesday"),
    ],
)
def test_contains(window: TimeWindow, moment: float, open_: bool) -> None:
    assert window.contains(moment) is open_


@pytest.mark.parametrize(
    ("days", "expected"),
    [
        ("mon-fri", {0, 1, 2, 3, 4}),
        ("sat,sun", {5, 6}),
        ("Sat, Sun", {5, 6}),
        ("fri-mon", {4, 5, 6, 0}),
        ("mon", {0}),
        ("mon-mon", {0}),
        ("mon,wed-thu", {0, 2, 3}),
        ("daily", set(range(7))),
        ("all", set(range(7))),
        ("*", set(range(7))),
        ("mon-sun", set(range(7))),
    ],
)
def test_day_specs(days: str, expected: set[int]) -> None:
    assert TimeWindow.parse(days, "00:00", "01:00").days == expected


@pytest.mark.parametrize(
    ("days", "start", "end"),
    [
        ("funday", "00:00", "01:00"),
        ("mon-xyz", "00:00", "01:00"),
        ("mon", "25:00", "01:00"),
        ("mon", "12:60", "13:00"),
        ("mon", "24:01", "01:00"),
        ("mon", "8", "09:00"),
        ("mon", "08:00", "9am"),
    ],
)
def test_bad_windows(days: str, start: str, end: str) -> None:
    with pytest.raises(InvalidQuantity):
        TimeWindow.parse(days, start, end)


def test_empty_window_never_opens() -> None:
    never = TimeWindow.parse("mon", "10:00", "10:00")
    assert not never.contains(at("mon", "10:00"))
    assert never.next_open(at("mon", "00:00")) is None
    assert next_window_open((never,), at("mon", "00:00")) is None


@pytest.mark.parametrize(
    ("windows", "moment", "expected"),
    [
        pytest.param((), at("wed", "12:00"), at("wed", "12:00"), id="no-windows-always-open"),
        pytest.param((NIGHTLY,), at("tue", "02:00"), at("tue", "02:00"), id="already-open"),
        pytest.param((NIGHTLY,), at("mon", "12:00"), at("mon", "20:00"), id="later-today"),
        pytest.param((NIGHTLY,), at("mon", "19:59", 30), at("mon", "20:00"), id="mid-minute"),
        pytest.param((NIGHTLY,), at("sat", "09:00"), at("mon2", "20:00"), id="after-weekend"),
        pytest.param((NIGHTLY, WEEKEND), at("sat", "09:00"), at("sat", "09:00"), id="weekend"),
        pytest.param((NIGHTLY, WEEKEND), at("fri", "09:00"), at("fri", "20:00"), id="earliest"),
        pytest.param((OFFICE, NIGHTLY), at("mon", "08:30"), at("mon", "09:00"), id="office"),
    ],
)
def test_next_window_open(windows: tuple[TimeWindow, ...], moment: float, expected: float) -> None:
    assert next_window_open(windows, moment) == expected
    assert window_open(windows, moment) is (expected == moment)


windows = st.builds(
    TimeWindow,
    days=st.frozensets(st.integers(0, 6), min_size=1),
    start=st.integers(0, 1439),
    end=st.integers(1, 1440),
).filter(lambda w: w.start != w.end)
moments = st.floats(min_value=at("mon", "00:00"), max_value=at("mon", "00:00") + 60 * 86400)


@given(window=windows, moment=moments)
def test_next_open_is_the_first_open_minute(window: TimeWindow, moment: float) -> None:
    opens = window.next_open(moment)
    assert opens is not None
    assert moment <= opens <= moment + 8 * 86400
    assert window.contains(opens)
    if opens - 60 >= moment:
        assert not window.contains(opens - 60)
