"""Start forecasts with run times learned from history."""

from __future__ import annotations

from dataclasses import replace

import pytest

from allotment.scheduler.forecast import (
    MIN_SAMPLES,
    TRIM,
    RuntimeHistory,
    forecast_start,
    forecast_starts,
)
from allotment.scheduler.session import Session
from tests.scheduler.builders import NOW, ClusterBuilder, job, running


def test_a_job_not_started_gets_the_median_run_time_of_its_kind() -> None:
    history = RuntimeHistory()
    assert history.runtime("a", 1000) is None
    for seconds in [10, 20, 30, 40, 50, 60, 70, 80, 90, 1000]:
        history.record("a", 1000, seconds)
    assert history.runtime("a", 1000) == 60  # the median of ten, upper middle
    # Too few of a kind: the queue, then everything, answers.
    history.record("a", 8000, 5)
    assert history.runtime("a", 8000) == 50  # 5 is now among the queue's eleven
    assert history.runtime("other", 1000) == 50


def test_a_running_job_gets_the_mean_residual_life_of_jobs_that_ran_longer() -> None:
    history = RuntimeHistory()
    for seconds in [10, 20, 30, 40, 50, 60, 70, 80, 90, 1000]:
        history.record("a", 1000, seconds)
    # Of the jobs that ran more than 75 s (80, 90, 1000), none is left out (5% of
    # three rounds to none): the mean of their lives is 390, so 315 s more.
    assert history.remaining("a", 1000, 75) == pytest.approx(390 - 75)
    # Outlived them all: as long again.
    assert history.remaining("a", 1000, 2000) == 2000
    # Just started: the mean of all ten (not the median, 60).
    assert history.remaining("a", 1000, 0) == pytest.approx(145)


def test_the_longest_residual_lives_are_left_out_of_the_mean() -> None:
    history = RuntimeHistory()
    for _ in range(19):
        history.record("a", 1000, 100)
    history.record("a", 1000, 1_000_000)  # one job of weeks among twenty
    assert round(20 * (1 - TRIM)) == 19
    assert history.remaining("a", 1000, 50) == pytest.approx(50)  # 100 - 50, the long one out
    assert history.runtime("a", 1000) == 100


def test_history_keeps_the_last_window() -> None:
    history = RuntimeHistory(window=MIN_SAMPLES)
    for _ in range(MIN_SAMPLES):
        history.record("a", 1000, 10)
    assert history.remaining("a", 1000, 0) == pytest.approx(10)
    for _ in range(MIN_SAMPLES):
        history.record("a", 1000, 500)
    assert history.runtime("a", 1000) == 500
    assert history.remaining("a", 1000, 0) == pytest.approx(500)  # sums made again


def test_a_declared_limit_bounds_the_guess() -> None:
    history = RuntimeHistory()
    for _ in range(MIN_SAMPLES):
        history.record("a", 1000, 5000)  # no limit declared: nothing learned of shares
    assert history.runtime("a", 1000, limit=600) == 600
    assert history.remaining("a", 1000, 500, limit=600) == 100
    assert history.remaining("a", 1000, 700, limit=600) == 1  # past it: stopped at once


def test_jobs_with_a_limit_use_the_mean_share_of_it_that_jobs_like_them_used() -> None:
    history = RuntimeHistory()
    for share in [0.2, 0.4, 0.6, 0.8, 1.0] * 2:
        history.record("a", 1000, share * 1000, limit=1000)
    # A job with a limit of one hour will likely use the mean share, 0.6 of it.
    assert history.runtime("a", 1000, limit=3600) == pytest.approx(0.6 * 3600)
    # One that has used half of it: the mean of the shares above one half, 0.8.
    assert history.remaining("a", 1000, 1800, limit=3600) == pytest.approx(0.8 * 3600 - 1800)
    # Near its limit: the jobs that used more used all of theirs.
    assert history.remaining("a", 1000, 3500, limit=3600) == pytest.approx(100)
    # Past every share learned: the run times answer (as long again), within the limit.
    history.record("a", 1000, 3000, limit=1000)  # ran past its limit (stopped late)
    assert history.remaining("a", 1000, 3000, limit=3600) == 600
    # A job without a limit: the median run time, 600.
    assert history.runtime("a", 1000) == 600


def test_a_users_own_runs_answer_first_then_the_queues() -> None:
    history = RuntimeHistory()
    for _ in range(MIN_SAMPLES):
        history.record("a", 1000, 3600, user="ada")
        history.record("a", 1000, 60, user="bob")
        history.record("a", 1000, 60, user="bob")
    assert history.runtime("a", 1000, user="ada") == 3600
    assert history.runtime("a", 1000, user="bob") == 60
    assert history.remaining("a", 1000, 600, user="ada") == pytest.approx(3000)
    # Someone who ran nothing here, or no user named: the queue's runs of that size.
    assert history.runtime("a", 1000, user="cy") == 60
    assert history.runtime("a", 1000) == 60
    # Another size: the user's runs in the queue, of any size, before the queue's.
    assert history.runtime("a", 8000, user="ada") == 3600
    assert history.runtime("a", 8000, user="cy") == 60
    # Too few of a user's runs: the queue answers.
    for _ in range(MIN_SAMPLES - 1):
        history.record("a", 1000, 7200, user="dee")
    assert history.runtime("a", 1000, user="dee") == 60
    # The shares of a declared limit, by user too.
    for _ in range(MIN_SAMPLES):
        history.record("a", 1000, 900, limit=1000, user="ada")
        history.record("a", 1000, 100, limit=1000, user="bob")
    assert history.runtime("a", 1000, limit=2000, user="ada") == pytest.approx(1800)
    assert history.runtime("a", 1000, limit=2000, user="bob") == pytest.approx(200)


def one_node(after_gpus: int) -> Session:
    """One 8-GPU node: ``r`` has held it for 30 s; ``next`` (8 GPUs) waits, then
    ``after`` (``after_gpus``)."""
    cluster = ClusterBuilder().pool("a100", nodes=1, gpu=8).leaf("a", quota={"a100": {"gpu": 8}})
    session = Session(cluster.build())
    session.started(running("r", "a", "a100-00", gpu=8, start=NOW - 30))
    session.submit(job("next", "a", gpu=8))
    session.submit(job("after", "a", gpu=after_gpus, submit=NOW))
    return session


def test_a_forecast_guesses_each_job_from_its_users_runs() -> None:
    session = one_node(after_gpus=8)
    history = RuntimeHistory()
    for _ in range(MIN_SAMPLES):
        history.record("a", 8000, 1000, user="ada")
        history.record("a", 8000, 100, user="bob")
        history.record("a", 8000, 100, user="bob")
    owners = {"r": "ada", "next": "bob", "after": "ada"}
    starts = forecast_starts(session, history, now=NOW, owners=owners)
    # ada's running job ends when her runs do; bob's next one runs as long as his.
    assert starts == {"next": NOW + 970, "after": NOW + 1070}
    assert forecast_start(session, "after", history, now=NOW, owners=owners) == NOW + 1070
    # Without users, the queue's runs (mostly bob's) answer for all.
    assert forecast_starts(session, history, now=NOW)["next"] < NOW + 970


def test_forecast_plays_the_session_forward_without_changing_it() -> None:
    session = one_node(after_gpus=4)
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
    # One play forward for every waiting job gives each the same start.
    starts = forecast_starts(session, history, now=NOW)
    assert starts == {"next": NOW + 70, "after": NOW + 170}
    # Within a bound on the cycles played: those that start within it.
    assert forecast_starts(session, history, now=NOW, max_steps=2) == {"next": NOW + 70}
    assert forecast_start(session, "after", history, now=NOW, max_steps=2) is None
    assert session.snapshot(NOW) == before


def test_forecast_uses_declared_ends_and_limits() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=1, gpu=8).leaf("a", quota={"a100": {"gpu": 8}})
    history = RuntimeHistory()
    for _ in range(MIN_SAMPLES):
        history.record("a", 8000, 1000)
    # A running job that declared when it will end ends then.
    session = Session(cluster.build())
    session.started(running("r", "a", "a100-00", gpu=8, start=NOW - 30, end=NOW + 5))
    session.submit(job("next", "a", gpu=8))
    assert forecast_start(session, "next", history, now=NOW) == NOW + 5
    # A running job with a limit is stopped at it; a waiting one is guessed within its own.
    session = Session(cluster.build())
    limited = running("r", "a", "a100-00", gpu=8, start=NOW - 30)
    session.started(replace(limited, max_end=NOW + 20))
    session.submit(job("next", "a", gpu=8, max_runtime=300))
    session.submit(job("after", "a", gpu=8, submit=NOW))
    assert forecast_start(session, "next", history, now=NOW) == NOW + 20
    assert forecast_start(session, "after", history, now=NOW) == NOW + 320
