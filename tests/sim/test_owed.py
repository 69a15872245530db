"""Owed waits: jobs that waited over five minutes while their queue held no more than
its guarantee minus their own GPUs (what an outside checker counts)."""

from __future__ import annotations

from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.sim.metrics import summarize
from allotment.sim.owed import owed_waits
from allotment.sim.results import Attempt, JobResult, ReplayResult

G = 1000  # one GPU in milli-GPUs


def job(job_id: str, queue: str, submit: float, start: float | None, gpus: int) -> JobResult:
    return JobResult(
        job_id=job_id, queue=queue, submit=submit, duration=100.0, gpus=gpus * G, first_start=start
    )


def ran(job_id: str, queue: str, start: float, end: float | None, gpus: int) -> Attempt:
    return Attempt(
        job_id=job_id,
        queue=queue,
        attempt=1,
        submit=0.0,
        start=start,
        end=end,
        gpus=gpus * G,
        nodes=(),
        outcome="succeeded",
    )


NOMINAL = {"a": 8 * G, "b": 8 * G}


def test_a_job_waiting_while_its_queue_had_room_for_it_is_owed() -> None:
    # Queue a holds 8 GPUs until 400, then nothing: the 4-GPU job waiting from 0 to
    # 1,000 had room for 600 s of its wait.
    attempts = [ran("x", "a", 0, 400, 8), ran("w", "a", 1000, 2000, 4)]
    counts = owed_waits([job("w", "a", 0, 1000, 4)], attempts, NOMINAL)
    assert counts == {"": 1, "a": 1}


def test_room_for_less_than_five_minutes_of_the_wait_is_not_owed() -> None:
    attempts = [ran("x", "a", 0, 800, 8), ran("w", "a", 1000, 2000, 4)]
    assert owed_waits([job("w", "a", 0, 1000, 4)], attempts, NOMINAL) == {"": 0, "a": 0}


def test_room_is_the_guarantee_minus_the_job_s_own_size() -> None:
    # Queue a holds 6 of its 8 GPUs all along: room for a 2-GPU job, not a 4-GPU one.
    attempts = [ran("x", "a", 0, 5000, 6)]
    jobs = [job("small", "a", 0, 1000, 2), job("large", "a", 0, 1000, 4)]
    assert owed_waits(jobs, attempts, NOMINAL) == {"": 1, "a": 1}


def test_other_queues_usage_does_not_matter_and_a_queue_without_a_guarantee_owes_nothing() -> None:
    attempts = [ran("x", "b", 0, 5000, 16)]  # b borrows everything
    jobs = [job("w", "a", 0, 1000, 4), job("c", "c", 0, 1000, 1), job("big", "a", 0, 1000, 16)]
    assert owed_waits(jobs, attempts, NOMINAL) == {"": 1, "a": 1, "c": 0}


def test_a_job_that_never_started_is_owed_until_the_replay_ends() -> None:
    attempts = [ran("x", "b", 0, 2000, 8)]
    assert owed_waits([job("w", "a", 0, None, 4)], attempts, NOMINAL)["a"] == 1


def test_the_summary_counts_owed_waits_overall_and_per_queue() -> None:
    result = ReplayResult(
        policy=SchedulerPolicy(),
        jobs=[job("x", "a", 0, 0, 8), job("w", "a", 0, 1000, 4), job("v", "b", 0, 0, 8)],
        attempts=[ran("x", "a", 0, 400, 8), ran("w", "a", 1000, 2000, 4), ran("v", "b", 0, 9, 8)],
        total_gpus=16 * G,
        nominal_gpus=NOMINAL,
    )
    summary = summarize(result)
    assert summary["owed_waits"] == 1
    assert summary["per_queue"]["a"]["owed_waits"] == 1
    assert summary["per_queue"]["b"]["owed_waits"] == 0
