"""Time windows: a queue outside its window admits nothing and says when it opens."""

from __future__ import annotations

from .builders import NOW, ClusterBuilder, admitted, codes, cycle, job, running

NIGHT = [{"days": "mon-fri", "from": "20:00", "to": "08:00"}]


def nightly() -> ClusterBuilder:
    return (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .leaf("night", quota={"a100": {"gpu": 8}}, time_windows=NIGHT)
        .leaf("day", quota={"a100": {"gpu": 0}})
    )


def test_outside_window_nothing_is_admitted() -> None:
    noon = NOW + 4 * 3600  # Monday 12:00 UTC
    decisions = cycle(nightly().build(), [job("j", "night", gpu=1)], now=noon)
    assert codes(decisions) == {"j": "outside_time_window"}
    reason = decisions.waiting["j"]
    assert reason.detail["opens_at"] == NOW + 12 * 3600  # Monday 20:00
    assert "opens in 8h" in reason.message


def test_inside_window_jobs_run() -> None:
    late = NOW + 14 * 3600  # Monday 22:00
    assert admitted(cycle(nightly().build(), [job("j", "night", gpu=1)], now=late)) == ["j"]
    early = NOW - 3600  # Monday 07:00: still Sunday night's window? Sunday is not in mon-fri
    assert codes(cycle(nightly().build(), [job("j", "night", gpu=1)], now=early)) == {
        "j": "outside_time_window"
    }
    tuesday_early = NOW + 23 * 3600  # Tuesday 07:00, Monday night's window
    assert admitted(cycle(nightly().build(), [job("j", "night", gpu=1)], now=tuesday_early)) == [
        "j"
    ]


def test_other_queues_unaffected() -> None:
    noon = NOW + 4 * 3600
    decisions = cycle(
        nightly().build(), [job("n", "night", gpu=1), job("d", "day", gpu=1)], now=noon
    )
    assert admitted(decisions) == ["d"]


def test_a_window_gates_starts_only_a_job_started_inside_runs_on_after_it_closes() -> None:
    noon = NOW + 4 * 3600  # Monday 12:00: the window closed at 08:00
    started = running("r", "night", "a100-00", gpu=4, start=NOW - 3 * 3600)
    decisions = cycle(nightly().build(), [job("j", "night", gpu=1)], [started], now=noon)
    assert decisions.preemptions == []  # nothing is stopped when the window closes
    assert codes(decisions) == {"j": "outside_time_window"}
