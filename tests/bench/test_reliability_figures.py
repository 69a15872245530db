"""The campaigns' figures count what they claim: a device held by two runs, a job run
twice, a job lost or stored twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench.reliability.runs import (
    RECORDER,
    Figures,
    Run,
    double_booked_seconds,
    double_runs,
    read_runs,
    tally,
)


def run(job: str, start: float, end: float, devices: str = "0", attempt: int = 1) -> Run:
    return Run(
        job, attempt, hash((job, start)) % 10_000, tuple(devices.split(",")), start, end, True
    )


def test_reliab_one_device_held_by_two_runs_is_counted_for_the_overlap() -> None:
    runs = [run("a", 0, 10), run("b", 8, 12), run("c", 12, 20), run("d", 0, 30, devices="1,2")]
    assert double_booked_seconds(runs) == pytest.approx(2.0)
    assert double_booked_seconds([*runs, run("e", 5, 6, devices="2")]) == pytest.approx(3.0)


def test_reliab_a_job_run_twice_at_once_or_per_attempt_is_a_double_run() -> None:
    sequential = [run("a", 0, 5, attempt=1), run("a", 6, 9, attempt=2)]
    assert double_runs(sequential) == []
    assert double_runs([run("a", 0, 5, attempt=1), run("a", 4, 9, attempt=2)]) == ["a"]
    assert double_runs([run("b", 0, 1), run("b", 2, 3)]) == ["b"]  # one attempt, twice


def test_reliab_lost_and_duplicated_jobs_are_counted() -> None:
    acknowledged = {"x": "j-1", "y": "j-2", "z": "j-3"}
    stored = [
        {"id": "j-1", "name": "x", "state": "succeeded", "attempt": 1},
        {"id": "j-2", "name": "y", "state": "succeeded", "attempt": 1},  # never ran
        {"id": "j-4", "name": "x", "state": "pending", "attempt": 1},  # stored twice
    ]
    figures = tally(Figures("t", "sqlite"), acknowledged, stored, [run("j-1", 0, 1)])
    assert (figures.acknowledged, figures.lost, figures.duplicated) == (3, 2, 1)
    assert not figures.clean


def test_reliab_the_recorder_writes_what_it_ran(tmp_path: Path) -> None:
    env = {**os.environ, "ALLOTMENT_JOB_ID": "j-9", "ALLOTMENT_ATTEMPT": "2"}
    env["CUDA_VISIBLE_DEVICES"] = "1,3"
    subprocess.run([sys.executable, "-c", RECORDER, str(tmp_path), "0.25"], env=env, check=True)
    [recorded] = read_runs(tmp_path)
    assert (recorded.job, recorded.attempt, recorded.devices) == ("j-9", 2, ("1", "3"))
    assert recorded.done and recorded.last - recorded.start >= 0.25
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["pid"] == recorded.pid


def test_reliab_a_retry_is_unclean_unless_the_faults_hit_jobs() -> None:
    acknowledged = {"x": "j-1"}
    stored = [{"id": "j-1", "name": "x", "state": "succeeded", "attempt": 2}]
    runs = [run("j-1", 0, 1, attempt=1), run("j-1", 2, 3, attempt=2)]
    assert not tally(Figures("crash_loop", "sqlite"), acknowledged, stored, runs).clean
    hit = Figures("supervisor_kills", "sqlite", jobs_may_fail=True)
    assert tally(hit, acknowledged, stored, runs).clean
