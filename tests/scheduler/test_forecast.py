"""Start forecasts with run times learned from history."""

from __future__ import annotations

from allotment.scheduler.forecast import MIN_SAMPLES, RuntimeHistory, forecast_start
from allotment.scheduler.session import Session
from tests.scheduler.builders import NOW, ClusterBuilder, job, running


def test_history_gives_the_median_of_jobs_that_ran_at_least_as_long() -> None:
    history = RuntimeHistory()
    assert history.runtime("a", 1000) is None
    for seconds in [10, 20, 30, 40, 50, 60, 70, 80, 90, 1000]:
        history.record("a", 1000, seconds)
    assert history.runtime("a", 1000) == 60  # the median of ten, upper middle
    assert history.remaining("a", 1000, 75) == 90 - 75  # median of 80, 90, 1000
    assert history.remaining("a", 1000, 2000) == 2000  # outlived them all: as long again
    # Too few of a kind: the queue, then everything, answers.
    history.record("a", 8000, 5)
    assert history.runtime("a", 8000) == 50  # 5 is now among the queue's eleven
    assert history.runtime("other", 1000) == 50


def test_history_keeps_the_last_window() -> None:
    history = RuntimeHistory(window=MIN_SAMPLES)
    for _ in range(MIN_SAMPLES):
        history.record("a", 1000, 10)
    for _ in range(MIN_SAMPLES):
        history.record("a", 1000, 500)
    assert history.runtime("a", 1000) == 500


def test_forecast_plays_the_session_forward_without_changing_it() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=1, gpu=8).leaf("a", quota={"a100": {"gpu": 8}})
    session = Session(cluster.build())
    session.started(running("r", "a", "a100-00", gpu=8, start=NOW - 30))
    session.submit(job("next", "a", gpu=8))
    session.submit(job("after", "a", gpu=4, submit=NOW))
    history = RuntimeHistory()
    assert forecast_start(session, "next", history, now=NOW) is None  # nothing learned yet
    for _ in range(MIN_SAMPLES):
        history.record("a", 8000, 100)
    for _ in range(MIN_SAMPLES):
        history.record("a", 4000, 1000)
    before = session.snapshot(NOW)
    assert forecast_start(session, "next", history, now=NOW) == NOW + 70
    assert forecast_start(session, "after", history, now=NOW) == NOW + 170
    assert forecast_start(session, "absent", history, now=NOW) is None
    assert session.snapshot(NOW) == before
