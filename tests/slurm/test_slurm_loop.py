"""Allotment's control loop on a real Slurm cluster: placement pinned, GPUs bound,
gangs across nodes, preemption, node failure and a restart."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from allotment.domain.lifecycle import JobState
from allotment.store.jobs import get_job
from allotment.store.models import Attempt
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import MakeLoop, Submit, drive, state_of

S = JobState


def logs(tmp_path: Path, job_id: str, attempt: int = 1) -> dict[str, str]:
    root = tmp_path / "work" / "me" / job_id / str(attempt) / "logs"
    return {p.name: p.read_text() for p in sorted(root.glob("*.out"))}


def test_a_gpu_job_sees_the_devices_slurm_bound(
    make_loop: MakeLoop, submit: Submit, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    loop = make_loop()
    job = submit(
        ["sh", "-c", 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $ALLOTMENT_JOB_ID"'], gpu=2
    )
    drive(loop, lambda: state_of(sessions, job) is S.SUCCEEDED, "the job succeeds")
    with sessions() as db:
        attempt = db.get(Attempt, (job, 1))
        assert attempt is not None
        node = attempt.allocation[0]["node"]
    out = logs(tmp_path, job)
    assert out == {"worker-0.out": f"{node} 0,1 {job}\n"}
    # The batch script left how it ended, for a server that comes back after Slurm forgot.
    result = tmp_path / "work" / "me" / job / "1" / "slurm" / "result"
    code, start, end = result.read_text().split()
    assert code == "0" and int(start) <= int(end)


def slurm_jobs(slurm: SlurmCluster) -> list[dict[str, object]]:
    return list(json.loads(slurm.run("squeue", "--json").stdout)["jobs"])


def nodes_of(sessions: sessionmaker[Session], job_id: str, attempt: int = 1) -> list[str]:
    with sessions() as db:
        row = db.get(Attempt, (job_id, attempt))
        assert row is not None
        return [p["node"] for p in row.allocation]


def test_a_two_node_gang_runs_as_one_slurm_job_on_the_two_chosen_nodes(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    clean: SlurmCluster,
) -> None:
    loop = make_loop()
    job = submit(["sh", "-c", 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'], replicas=2, gpu=4)
    drive(loop, lambda: state_of(sessions, job) is S.SUCCEEDED, "the gang succeeds")
    placed = nodes_of(sessions, job)
    assert len(set(placed)) == 2
    out = logs(tmp_path, job)
    assert out == {
        "worker-0.out": f"{placed[0]} 0,1,2,3\n",
        "worker-1.out": f"{placed[1]} 0,1,2,3\n",
    }
    mine = [j for j in slurm_jobs(clean) if j["name"] == f"allot-{job}-1"]
    assert len(mine) == 1
    assert mine[0]["job_state"] == "COMPLETED"
    assert mine[0]["requeue"] is False


def test_unequal_shares_run_as_one_heterogeneous_job(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    """Three 2-GPU replicas on two 4-GPU nodes: two on one node, one on the other."""
    loop = make_loop()
    job = submit(["sh", "-c", 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'], replicas=3, gpu=2)
    drive(loop, lambda: state_of(sessions, job) is S.SUCCEEDED, "the gang succeeds")
    placed = nodes_of(sessions, job)
    assert len(set(placed)) == 2
    out = logs(tmp_path, job)
    seen = sorted(out.values())
    assert len(seen) == 3
    for name, text in out.items():
        index = int(name.split("-")[1].split(".")[0])
        node, devices = text.split()
        assert node == placed[index]
        assert len(devices.split(",")) == 2
    shared = [t.split()[1] for t in out.values() if t.split()[0] == placed[0]]
    if placed.count(placed[0]) == 2:
        assert sorted(shared) == ["0,1", "2,3"]  # each replica its own pair


def test_preemption_stops_the_victim_in_slurm_and_requeues_it(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    clean: SlurmCluster,
) -> None:
    loop = make_loop()
    low = submit(["sleep", "300"], replicas=2, gpu=4, priority_class="experiment")
    drive(loop, lambda: state_of(sessions, low) is S.RUNNING, "the low job runs")
    high = submit(["sleep", "300"], gpu=4, priority_class="key-project")
    drive(loop, lambda: state_of(sessions, high) is S.RUNNING, "the high job runs")
    with sessions() as db:
        victim = get_job(db, low)
        first = db.get(Attempt, (low, 1))
        assert first is not None
        assert first.state == S.PREEMPTED.value
    assert victim.state == S.PENDING.value  # requeued by Allotment's retry policy
    states = {j["name"]: j["job_state"] for j in slurm_jobs(clean)}
    # Stopped, not left running: CANCELLED when the grace ran out first, FAILED when its
    # replicas ended on the forwarded stop signal before that (Slurm's own view; the
    # attempt is PREEMPTED in Allotment either way, as asserted above).
    assert states[f"allot-{low}-1"] in {"CANCELLED", "FAILED"}
    assert first.failure_class == "preempted"
    assert states[f"allot-{high}-1"] == "RUNNING"
    assert f"allot-{low}-2" not in states  # never requeued by Slurm, nor yet by Allotment
    assert set(nodes_of(sessions, high)) <= set(nodes_of(sessions, low))


def test_a_dead_node_fails_its_jobs_which_run_again_elsewhere(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    clean: SlurmCluster,
) -> None:
    loop = make_loop()
    job = submit(["sleep", "300"], gpu=4)
    drive(loop, lambda: state_of(sessions, job) is S.RUNNING, "the job runs")
    (dead,) = nodes_of(sessions, job)
    clean.kill_node(dead)
    drive(
        loop,
        lambda: get_attempt_state(sessions, job, 1) == S.FAILED.value,
        "the attempt on the dead node fails",
        timeout=90,
    )
    with sessions() as db:
        first = db.get(Attempt, (job, 1))
        assert first is not None
        assert first.failure_class == "node_failure"
    assert not loop.cluster.nodes[dead].healthy
    drive(loop, lambda: state_of(sessions, job) is S.RUNNING, "the retry runs", timeout=60)
    (again,) = nodes_of(sessions, job, 2)
    assert again != dead
    # The node comes back: Allotment places work there again.
    clean.start_node(dead)
    clean.run("scontrol", "update", f"nodename={dead}", "state=resume", check=False)
    drive(loop, lambda: loop.cluster.nodes[dead].healthy, "the node is healthy again", timeout=60)


def get_attempt_state(sessions: sessionmaker[Session], job: str, number: int) -> str | None:
    with sessions() as db:
        row = db.get(Attempt, (job, number))
        return None if row is None else row.state


def test_a_restarted_server_adopts_its_slurm_jobs_without_submitting_them_again(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    clean: SlurmCluster,
) -> None:
    loop = make_loop()
    job = submit(["sleep", "4"], replicas=2, gpu=4)
    drive(loop, lambda: state_of(sessions, job) is S.RUNNING, "the gang runs")
    restarted = make_loop()  # a new server: new executor, nothing in memory
    assert restarted.reconcile() == []
    drive(restarted, lambda: state_of(sessions, job) is S.SUCCEEDED, "the gang succeeds")
    mine = [j for j in slurm_jobs(clean) if str(j["name"]).startswith(f"allot-{job}-")]
    assert len(mine) == 1


def test_a_launch_repeated_after_a_crash_finds_the_submitted_job(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    clean: SlurmCluster,
) -> None:
    """The crash falls between ``sbatch`` and the store's move to starting: the next
    server launches the admitted job again, and Slurm's copy is found by its name."""
    loop = make_loop()
    job = submit(["sleep", "3"], gpu=1)
    loop.cycle()  # admitted and launched
    with sessions.begin() as db:
        row = get_job(db, job)
        assert row.state == S.STARTING.value
        row.state = S.ADMITTED.value  # as if the move had not been committed
    restarted = make_loop()
    restarted.reconcile()  # launches admitted jobs again
    drive(restarted, lambda: state_of(sessions, job) is S.SUCCEEDED, "the job succeeds")
    mine = [j for j in slurm_jobs(clean) if str(j["name"]).startswith(f"allot-{job}-")]
    assert len(mine) == 1


def test_the_start_up_check_passes_here_and_names_a_wrong_partition(
    make_loop: MakeLoop,
) -> None:
    from allotment.executors.slurm import SlurmExecutor

    loop = make_loop()
    executor = loop.executor
    assert isinstance(executor, SlurmExecutor)
    assert executor.check() == []
    settings = executor.settings.model_copy(update={"partition": "nowhere"})
    wrong = SlurmExecutor(settings, executor.records.root)
    problems = wrong.check()
    assert any("partition does not exist" in p for p in problems)
