"""The Kueue baseline bench on a tiny configuration: every job ends succeeded, none is
lost (behaviour only; no figure is checked)."""

from __future__ import annotations

from dataclasses import replace

from bench.bench_kueue import Config, JobClass, arrivals, run_burst, run_drain

TINY = Config(
    cohorts=1,
    queues_per_cohort=2,
    nominal=4,
    borrowing_limit=4,
    node_gpus=8,
    classes=(
        JobClass("small", 1, 0.05, 50, 0.01, 8),
        JobClass("medium", 2, 0.1, 100, 0.05, 3),
        JobClass("large", 4, 0.2, 200, 0.1, 2),
    ),
    clients=4,
    client_procs=0,
    tick_s=0.01,
    timeout_s=120.0,
)


def test_arrivals_follow_the_schedule() -> None:
    items = arrivals(TINY)
    assert len(items) == TINY.jobs == 26
    assert [a.offset_s for a in items] == sorted(a.offset_s for a in items)
    larges = [a.offset_s for a in items if a.queue == "c0-q1" and a.klass == "large"]
    assert larges == [0.0, 0.1]


def test_drain_runs_every_job_to_success() -> None:
    result = run_drain(TINY)
    assert (result.failed_turns, result.last_error) == (0, None)
    assert result.errors == []
    assert result.submitted == TINY.jobs
    assert result.states == {"succeeded": TINY.jobs}
    assert {k: len(v) for k, v in result.admission_s.items()} == {
        "small": 16,
        "medium": 6,
        "large": 4,
    }
    assert all(w >= 0 for waits in result.admission_s.values() for w in waits)
    assert result.failed_turns == 0


def test_burst_stores_every_submission() -> None:
    assert run_burst(TINY, clients=3, jobs=12) > 0  # raises if one is lost


def test_burst_with_api_tokens_stores_every_submission() -> None:
    config = replace(TINY, tokens=True, client_procs=1)
    assert run_burst(config, clients=3, jobs=12) > 0  # raises if one is refused or lost


def test_burst_from_client_processes_in_batches_stores_every_submission() -> None:
    config = replace(TINY, client_procs=2, batch=5)
    assert run_burst(config, clients=4, jobs=23) > 0  # raises if one is lost


def test_drain_in_batches_runs_every_job_to_success() -> None:
    result = run_drain(replace(TINY, batch=4))
    assert result.errors == []
    assert result.states == {"succeeded": TINY.jobs}


def test_drain_with_the_loop_in_a_process_of_its_own_runs_every_job_to_success() -> None:
    result = run_drain(replace(TINY, loop_process=True))
    assert (result.failed_turns, result.last_error) == (0, None)
    assert result.errors == []
    assert result.states == {"succeeded": TINY.jobs}
    assert result.turns > 0  # the loop process's own count came back
