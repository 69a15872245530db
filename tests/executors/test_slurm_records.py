"""What the Slurm executor remembers, without a cluster: Slurm's answers are canned, the
commands it runs are recorded. How an attempt ended survives Slurm forgetting the job
and a restart; a job of another user or a second job with the same comment is never
taken for an attempt; a stop of an attempt whose submission failed on our side still
cancels what may have reached Slurm."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from allotment.domain.executor import SlurmSettings
from allotment.domain.lifecycle import FailureClass
from allotment.executors.base import ReplicaKey, ReplicaPhase
from allotment.executors.failures import classify
from allotment.executors.slurm import SlurmExecutor
from allotment.executors.slurm_records import RESULT_FILE, Record

SETTINGS = SlurmSettings.model_validate({"partition": "gpu", "pools": {"a": {"gres_type": "a"}}})
KEYS = (ReplicaKey("j-1", 1, "worker", 0), ReplicaKey("j-1", 1, "worker", 1))


class Canned(SlurmExecutor):
    """Answers ``squeue --json`` with ``jobs``; records every other command."""

    def __init__(self, state: Path, jobs: list[dict[str, Any]] | None = None) -> None:
        super().__init__(SETTINGS, state, clock=lambda: 1000.0)
        self.jobs = jobs or []
        self.ran: list[tuple[str, ...]] = []

    def run(self, command: str, *args: str, stdin: str | None = None) -> str:
        if command == "squeue":
            return json.dumps({"jobs": self.jobs})
        self.ran.append((command, *args))
        return ""


def slurm_job(slurm_id: int, state: str, *, user: int | None = None, **more: Any) -> dict[str, Any]:
    return {
        "job_id": slurm_id,
        "name": "allot-j-1-1",
        "comment": "allotment job=j-1 attempt=1 replicas=worker-0,worker-1",
        "job_state": state,
        "state_reason": "None",
        "start_time": 900,
        "end_time": 950,
        "submit_time": 890,
        "exit_code": 0,
        "user_id": os.getuid() if user is None else user,
        **more,
    }


def record(slurm_dir: Path | None, slurm_id: int = 7) -> Record:
    return Record(
        job_id="j-1",
        attempt=1,
        slurm_id=slurm_id,
        keys=KEYS,
        slurm_dir=None if slurm_dir is None else str(slurm_dir),
        submitted_at=880.0,
    )


def test_how_an_attempt_ended_outlives_slurm_and_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    executor = Canned(state, [slurm_job(7, "FAILED", exit_code=3 << 8)])
    executor.records.put(record(tmp_path))
    seen = executor.observe()
    assert set(seen) == set(KEYS) and seen[KEYS[0]].exit_code == 3
    restarted = Canned(state, [])  # Slurm has forgotten the job (MinJobAge passed)
    again = restarted.observe()[KEYS[1]]
    assert (again.phase, again.exit_code) == (ReplicaPhase.EXITED, 3)


def test_an_attempt_slurm_forgot_ends_as_its_batch_script_said(tmp_path: Path) -> None:
    (tmp_path / RESULT_FILE).write_text("0 900 960\n")
    executor = Canned(tmp_path / "state")
    executor.records.put(record(tmp_path))
    status = executor.observe()[KEYS[0]]
    assert (status.phase, status.exit_code, status.started_at) == (ReplicaPhase.EXITED, 0, 900)
    assert classify(status) is None  # succeeded, not re-run as a zombie


def test_an_attempt_slurm_forgot_without_a_result_is_lost(tmp_path: Path) -> None:
    executor = Canned(tmp_path / "state")
    executor.records.put(record(tmp_path / "nothing-here"))
    status = executor.observe()[KEYS[0]]
    assert status.phase is ReplicaPhase.LOST and classify(status) is FailureClass.NODE_FAILURE


def test_another_users_job_with_allotments_comment_is_not_taken(tmp_path: Path) -> None:
    forged = slurm_job(9, "COMPLETED", user=os.getuid() + 1)
    executor = Canned(tmp_path / "state", [forged])
    assert executor.observe() == {}
    assert executor.records.all() == []
    executor.stop(KEYS[0], 5.0)  # nothing of ours: cancelled by name as our user only
    assert executor.ran == [("scancel", "--me", "--name=allot-j-1-1")]


def test_a_second_job_with_an_attempts_comment_is_ignored(tmp_path: Path) -> None:
    executor = Canned(tmp_path / "state", [slurm_job(7, "RUNNING"), slurm_job(8, "COMPLETED")])
    executor.records.put(record(tmp_path))
    assert {s.phase for s in executor.observe().values()} == {ReplicaPhase.RUNNING}


def test_a_job_submitted_just_before_a_crash_is_adopted_once(tmp_path: Path) -> None:
    executor = Canned(
        tmp_path / "state", [slurm_job(7, "RUNNING", standard_output="/w/slurm/slurm-%j.out")]
    )
    assert executor.launch_all([]) == []
    seen = executor.observe()
    assert seen[KEYS[0]].phase is ReplicaPhase.RUNNING
    adopted = executor.records.get("j-1", 1)
    assert adopted is not None and (adopted.slurm_id, adopted.slurm_dir) == (7, "/w/slurm")
    assert Canned(tmp_path / "state").records.get("j-1", 1) == adopted  # on disk
