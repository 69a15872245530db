"""The charts of ``allot sim --plot``: the numbers behind them, and the PNG files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from allotment.domain.cluster import Cluster
from allotment.domain.errors import InvalidInput
from allotment.sim.metrics import summarize
from allotment.sim.plots import (
    SIZES_PX,
    QueueUsage,
    queue_usage,
    replay_span,
    utilization_bins,
    wait_cdf,
    write_plots,
)
from allotment.sim.policies import parse_policy
from allotment.sim.replay import replay
from allotment.sim.results import PREEMPTED, SUCCEEDED, UNFINISHED, Attempt, JobResult, ReplayResult
from allotment.sim.trace import TraceJob

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def attempt(
    start: float | None,
    end: float | None,
    gpus: float,
    *,
    job: str = "j1",
    queue: str = "team-a",
    submit: float = 0.0,
    number: int = 1,
    outcome: str = SUCCEEDED,
) -> Attempt:
    return Attempt(
        job_id=job,
        queue=queue,
        attempt=number,
        submit=submit,
        start=start,
        end=end,
        gpus=int(gpus * 1000),
        nodes=(),
        outcome=outcome,
    )


def result_of(jobs: list[JobResult], attempts: list[Attempt]) -> ReplayResult:
    return ReplayResult(
        policy=parse_policy("default"), jobs=jobs, attempts=attempts, total_gpus=8000
    )


def job_result(
    job_id: str, queue: str, submit: float, first_start: float | None, end: float | None
) -> JobResult:
    return JobResult(
        job_id=job_id,
        queue=queue,
        submit=submit,
        duration=1.0,
        gpus=4000,
        first_start=first_start,
        end=end,
        outcome=SUCCEEDED if end is not None else UNFINISHED,
    )


# -- utilization ---------------------------------------------------------------------


def test_all_gpus_held_half_the_time_average_one_half() -> None:
    edges, values = utilization_bins([attempt(0, 50, 4)], 4000, start=0, end=100, bins=1)
    assert edges == [0, 100]
    assert values == [pytest.approx(0.5)]


def test_half_the_gpus_held_all_the_time_average_one_half() -> None:
    _, values = utilization_bins([attempt(0, 100, 2)], 4000, start=0, end=100, bins=1)
    assert values == [pytest.approx(0.5)]


def test_each_bin_is_a_time_weighted_average() -> None:
    attempts = [
        attempt(0, 50, 2),  # half of 4 GPUs in the first half
        attempt(25, 75, 4, job="j2"),  # all of them across the middle
        attempt(90, None, 4, job="j3"),  # never ended: not held
        attempt(None, None, 4, job="j4", outcome=UNFINISHED),  # never started
    ]
    edges, values = utilization_bins(attempts, 4000, start=0, end=100, bins=4)
    assert edges == [0, 25, 50, 75, 100]
    assert values == pytest.approx([0.5, 1.5, 1.0, 0.0])
    # Bins that cut through a step: 2 GPUs of 4 for 0-50, then 4 of 4 for 25-75.
    _, values = utilization_bins(attempts, 4000, start=0, end=100, bins=3)
    expected = [
        (2 * 100 / 3 + 4 * (100 / 3 - 25)) / 4 / (100 / 3),
        (2 * (50 - 100 / 3) + 4 * (100 / 3)) / 4 / (100 / 3),
        4 * (75 - 200 / 3) / 4 / (100 / 3),
    ]
    assert values == pytest.approx(expected)


def test_bins_are_bounded_and_empty_spans_give_nothing() -> None:
    attempts = [attempt(float(i), float(i) + 0.5, 1, job=f"j{i}") for i in range(4000)]
    edges, values = utilization_bins(attempts, 1000, start=0, end=4000)
    assert len(values) == 2000 and len(edges) == 2001
    assert values == pytest.approx([0.5] * 2000)
    assert utilization_bins(attempts, 1000, start=10, end=10) == ([], [])


# -- waits and queues -----------------------------------------------------------------


def test_wait_cdf_floors_short_waits_and_thins_long_lists() -> None:
    jobs = [
        job_result("a", "team-a", 0, 0, 10),
        job_result("b", "team-a", 0, 100, 110),
        job_result("c", "team-a", 0, 10, 20),
        job_result("d", "team-a", 0, None, None),  # never started: left out
    ]
    waits, shares = wait_cdf(result_of(jobs, []))
    assert waits == [1.0, 10.0, 100.0]
    assert shares == pytest.approx([1 / 3, 2 / 3, 1.0])
    many = [job_result(f"j{i}", "team-a", 0, float(i), None) for i in range(10_000)]
    waits, shares = wait_cdf(result_of(many, []), points=100)
    assert len(waits) == 100
    assert waits[-1] == 9999.0 and shares[-1] == 1.0
    assert waits == sorted(waits)


def test_queue_usage_average_held_and_time_below_guarantee(tiny_cluster: Cluster) -> None:
    jobs = [
        job_result("a1", "team-a", 0, 10, 60),
        job_result("a2", "team-a", 0, 60, 100),
        job_result("b1", "team-b", 20, 20, 100),
        job_result("b2", "team-b", 90, None, None),
    ]
    attempts = [
        attempt(10, 60, 4, job="a1"),
        attempt(60, 100, 4, job="a2"),
        attempt(20, 40, 4, job="b1", queue="team-b", submit=20, outcome=PREEMPTED),
        attempt(70, 100, 4, job="b1", queue="team-b", submit=20, number=2),
        attempt(None, None, 4, job="b2", queue="team-b", submit=90, outcome=UNFINISHED),
    ]
    result = result_of(jobs, attempts)
    assert replay_span(result) == (0, 100)
    assert queue_usage(result, tiny_cluster) == [
        # Held 4 GPUs for 90 of 100 s; waited below its 4 during 0-10.
        QueueUsage(queue="team-a", held_avg=3.6, guarantee=4.0, below_guarantee_share=0.1),
        # Held 4 GPUs for 50 s; b1 waited with nothing held from its preemption at 40
        # to its restart at 70; b2 waited from 90 while the queue held its guarantee.
        QueueUsage(queue="team-b", held_avg=2.0, guarantee=4.0, below_guarantee_share=0.3),
    ]


# -- the PNG files ----------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def contended_trace() -> list[TraceJob]:
    """Team a wants both nodes; team b comes back for its own later."""
    jobs = [
        TraceJob(job_id=f"a{i}", submit_time=i, duration=600, queue="team-a", gpus=4000)
        for i in range(3)
    ]
    jobs.append(TraceJob(job_id="b0", submit_time=300, duration=300, queue="team-b", gpus=4000))
    return jobs


def test_write_plots_from_real_replays(tiny_cluster: Cluster, tmp_path: Path) -> None:
    trace = contended_trace()
    results = [
        (name, replay(tiny_cluster, trace, parse_policy(name)))
        for name in ("fifo-isolated", "borrowing")
    ]
    directory = tmp_path / "charts" / "run1"
    written = write_plots(results, tiny_cluster, directory)
    assert [p.name for p in written] == ["utilization.png", "wait_cdf.png", "queue_share.png"]
    for path in written:
        assert path.parent == directory
        assert path.stat().st_size > 5_000
        assert png_size(path) == SIZES_PX[path.name]
    # The utilization curve averages to the summary's utilization.
    for _, result in results:
        span = replay_span(result)
        assert span is not None
        _, values = utilization_bins(result.attempts, result.total_gpus, start=span[0], end=span[1])
        assert sum(values) / len(values) == pytest.approx(summarize(result)["utilization"], 1e-3)


def test_write_plots_without_data(tiny_cluster: Cluster, tmp_path: Path) -> None:
    written = write_plots([("default", result_of([], []))], tiny_cluster, tmp_path)
    assert [png_size(p) for p in written] == list(SIZES_PX.values())


def test_plot_directory_that_is_a_file(tiny_cluster: Cluster, tmp_path: Path) -> None:
    target = tmp_path / "charts"
    target.write_text("not a directory")
    with pytest.raises(InvalidInput, match="is a file, not a directory"):
        write_plots([], tiny_cluster, target)
    with pytest.raises(InvalidInput, match="cannot be created"):
        write_plots([], tiny_cluster, target / "below")
