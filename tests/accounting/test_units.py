"""The pure parts by hand: sample coverage, waits, the window's parsing."""

from __future__ import annotations

import pytest

from allotment.accounting.figures import UsageSample, Window, covered
from allotment.accounting.report import parse_window
from allotment.accounting.waits import Move, histogram, percentile, waits
from allotment.domain.errors import InvalidInput

T0 = 1_800_000_000.0


def test_overlapping_samples_count_once_and_are_clipped() -> None:
    samples = [
        UsageSample(start=0, length=100, util=50),
        UsageSample(start=50, length=100, util=100),  # 50..100 already counted
        UsageSample(start=200, length=100, util=None),  # unmeasured
        UsageSample(start=250, length=100, util=150),  # clamped to 100, clipped at 300
    ]
    seconds, busy = covered(samples, 10, 300)
    assert seconds == 90 + 50 + 50
    assert busy == (90 * 50 + 50 * 100 + 50 * 100) / 100


def test_waits_from_pending_to_admission() -> None:
    window = Window(since=T0, until=T0 + 1000)
    moves = [
        Move(job="a", at=T0 - 50, to_state="pending"),
        Move(job="a", at=T0 + 10, to_state="admitted"),  # 60 s, admitted in the window
        Move(job="a", at=T0 + 20, to_state="preempted"),
        Move(job="a", at=T0 + 30, to_state="pending"),  # requeued
        Move(job="a", at=T0 + 130, to_state="admitted"),  # 100 s
        Move(job="b", at=T0 + 5, to_state="pending"),
        Move(job="b", at=T0 + 6, to_state="cancelled"),  # not a wait for admission
        Move(job="c", at=T0 - 500, to_state="pending"),
        Move(job="c", at=T0 - 100, to_state="admitted"),  # before the window
        Move(job="d", at=T0 + 900, to_state="pending"),  # still waiting: 100 s
        Move(job="e", at=T0 + 990, to_state="pending"),
        Move(job="e", at=T0 + 1000, to_state="admitted"),  # at the window's end: excluded
    ]
    labels = dict.fromkeys("abcde", ("q", "training"))
    found = waits(moves, labels, window)
    assert [(w.job, w.start, w.end) for w in found] == [
        ("a", T0 - 50, T0 + 10),
        ("a", T0 + 30, T0 + 130),
        ("d", T0 + 900, None),
        ("e", T0 + 990, None),
    ]
    assert {label: n for label, _, n in histogram(found) if n} == {"1m-5m": 2}


def test_nearest_rank_percentiles() -> None:
    ordered = [float(v) for v in range(1, 21)]
    assert (percentile(ordered, 50), percentile(ordered, 95), percentile([7.0], 95)) == (
        10.0,
        19.0,
        7.0,
    )


def test_parse_window() -> None:
    assert parse_window("7d", None, now=T0) == Window(since=T0 - 7 * 86400, until=T0)
    assert parse_window("90", str(T0), now=0) == Window(since=T0 - 90, until=T0)
    assert parse_window("2027-01-15T08:00:00Z", "2027-01-16", now=0) == Window(
        since=T0, until=T0 + 16 * 3600
    )
    assert parse_window("2027-01-15T09:00:00+01:00", None, now=T0 + 5) == Window(
        since=T0, until=T0 + 5
    )


@pytest.mark.parametrize(
    ("since", "until", "named"),
    [
        ("soon", None, "since"),
        ("2027-13-45", None, "since"),
        ("1d", "tomorrow", "until"),
        ("0s", None, "before"),
        ("2027-02-01", "2027-01-01", "before"),
        ("400d", None, "366 days"),
        ("1d", "9" * 400, "until"),
    ],
)
def test_bad_windows_say_what_to_change(since: str, until: str | None, named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        parse_window(since, until, now=T0)


def test_fault_a_timeline_of_a_window_too_small_for_its_floats_does_not_divide_by_zero() -> None:
    from allotment.accounting.figures import timeline

    since = 1_800_000_000.0
    window = Window(since=since, until=since + 1e-6)  # 96 spans narrower than a float step
    buckets = timeline([], window, 96)
    assert len(buckets) == 96
    assert all(b.allocated == b.measured == b.used == 0.0 for b in buckets)
