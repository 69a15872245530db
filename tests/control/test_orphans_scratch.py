"""Zombies and orphans reported (and cleaned by policy), the local executor's per-replica
usage, and scratch expiry: with the real local executor, real processes and SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.orphans import OrphanTracker
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import LaunchRequest
from allotment.store.audit import list_records
from allotment.store.layout import attempt_dir
from allotment.store.models import Attempt, Event
from allotment.telemetry.sources import DeviceReading
from allotment.upkeep.scratch import expire_scratch
from tests.control.conftest import (
    CLUSTER,
    MakeLoop,
    Submit,
    executor_of,
    key_of,
    run_until,
    state_of,
    wait_until,
)

S = JobState


def events(sessions: sessionmaker[Session], kind: str) -> list[Event]:
    with sessions() as db:
        return list(db.scalars(select(Event).where(Event.kind == kind)))


def test_a_zombie_is_reported_with_its_evidence_and_counted(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("import time; time.sleep(30)")
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING}) is S.RUNNING
    directory = executor_of(loop).replica_dir(key_of(job_id))
    state = json.loads((directory / "state.json").read_text())
    for pgid in (state["supervisor_pid"], state["pgid"]):  # the executor loses them
        os.killpg(pgid, signal.SIGKILL)
    wait_until(lambda: executor_of(loop).observe()[key_of(job_id)].phase.value == "lost", "lost")

    loop.reconcile()
    assert state_of(sessions, job_id) is S.FAILED
    [event] = events(sessions, "zombie")
    assert event.job_id == job_id and event.detail["attempt"] == 1
    [(replica, seen)] = event.detail["replicas"].items()
    assert replica == str(key_of(job_id)) and seen["phase"] == "lost"
    with sessions() as db:
        [record] = list_records(db, action="job.zombie")
    assert (record.user, record.object, record.tenant) == ("allotment", job_id, "me")
    assert loop.orphans.counts == {"zombie": 1}


def stranger(loop_executor: object, tmp_path: Path) -> LaunchRequest:
    request = LaunchRequest(
        job_id="stranger",
        attempt=1,
        command=[sys.executable, "-c", "import time; time.sleep(30)"],
        workdir=tmp_path,
    )
    return request


def test_an_orphan_replica_is_reported_once_and_left_running_by_default(
    make_loop: MakeLoop, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    loop = make_loop()
    request = stranger(loop.executor, tmp_path)
    executor_of(loop).launch(request)
    wait_until(lambda: executor_of(loop).observe()[request.key].phase.value == "running", "run")
    assert loop.reconcile() == [request.key]
    assert loop.reconcile() == [request.key]
    [event] = events(sessions, "orphan_replica")
    assert event.job_id is None and event.detail["replica"] == str(request.key)
    assert event.detail["policy"] == "report" and event.detail["phase"] == "running"
    with sessions() as db:
        assert [r.object for r in list_records(db, action="orphan.replica")] == [str(request.key)]
    assert not executor_of(loop).observe()[request.key].ended


def test_under_kill_an_orphan_replica_is_stopped_once_confirmed(
    make_loop: MakeLoop, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    loop = make_loop()
    loop.state.apply(load_cluster_text(CLUSTER.read_text() + "\norphans: kill\n"))
    assert loop.sync()  # the loop takes the configuration in use at a turn's start
    request = stranger(loop.executor, tmp_path)
    executor_of(loop).launch(request)
    wait_until(lambda: executor_of(loop).observe()[request.key].phase.value == "running", "run")
    loop.reconcile()  # first sighting: reported, not touched
    time.sleep(0.3)
    assert not executor_of(loop).observe()[request.key].ended
    loop.reconcile()  # confirmed: stopped
    wait_until(lambda: executor_of(loop).observe()[request.key].ended, "the orphan stopped")


def test_the_local_executor_measures_a_replicas_cpu_and_memory(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()
    job_id = submit("x = bytearray(50 * 2**20)\nwhile True: pass")
    loop.cycle()
    assert run_until(loop, sessions, job_id, {S.RUNNING}) is S.RUNNING
    executor = executor_of(loop)
    first = executor.usage()[key_of(job_id)]
    assert first.cpu_cores is None  # nothing to compare with yet
    time.sleep(0.5)
    second = executor.usage()[key_of(job_id)]
    assert second.cpu_cores is not None and second.cpu_cores > 0.3
    assert second.memory_bytes is not None and second.memory_bytes > 50 * 2**20
    status = executor.observe()[key_of(job_id)]
    assert status.pid in second.pids


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=5)


def test_gpu_memory_held_by_no_job_is_reported_and_only_a_provable_orphan_killed(
    sessions: sessionmaker[Session], sleepers: list[subprocess.Popen[bytes]]
) -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    left_over = subprocess.Popen(
        sleep, env={**os.environ, "ALLOTMENT_JOB_ID": "j-gone", "ALLOTMENT_ATTEMPT": "3"}
    )
    foreign = subprocess.Popen(
        sleep, env={k: v for k, v in os.environ.items() if not k.startswith("ALLOTMENT_")}
    )
    ours = subprocess.Popen(sleep)
    sleepers.extend([left_over, foreign, ours])
    readings = [
        DeviceReading(node="n", device=0, utilization=0, memory_used=1, pids=(left_over.pid,)),
        DeviceReading(
            node="n", device=1, utilization=0, memory_used=1, pids=(foreign.pid, ours.pid)
        ),
    ]
    tracker = OrphanTracker(policy=lambda: "kill")
    owned = {ours.pid}
    for _ in range(2):
        with sessions.begin() as db:
            killed = tracker.gpu_processes(db, readings, owned, time.time())
    assert killed == [left_over.pid]  # on the second sighting only
    assert left_over.wait(timeout=5) == -signal.SIGKILL
    assert foreign.poll() is None and ours.poll() is None
    reported = events(sessions, "orphan_gpu_process")
    assert sorted(e.detail["pid"] for e in reported) == sorted([left_over.pid, foreign.pid])
    provable = {e.detail["pid"]: e.detail["provable"] for e in reported}
    assert provable == {left_over.pid: True, foreign.pid: False}
    assert tracker.counts == {"orphan_gpu_process": 2}
    assert tracker.foreign == {("n", 1)}  # the killed one's device is free again


def test_fault_a_device_an_orphan_process_holds_is_given_to_no_job(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit
) -> None:
    loop = make_loop()  # one node, localhost, of two GPUs
    loop.orphans.foreign = frozenset({("localhost", 0)})
    code = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep(30)"
    first, second = submit(code), submit(code)
    loop.cycle()
    assert run_until(loop, sessions, first, {S.RUNNING}) is S.RUNNING
    with sessions() as db:
        attempt = db.get(Attempt, (first, 1))
        assert attempt is not None
        assert [p["devices"] for p in attempt.allocation] == [[1]]
    for _ in range(3):
        decisions = loop.cycle()
    assert state_of(sessions, second) is S.PENDING
    assert decisions.waiting[second].code.value in {"no_node_fits", "quota_exhausted"}
    loop.orphans.foreign = frozenset()  # the orphan ended
    assert run_until(loop, sessions, second, {S.RUNNING}) is S.RUNNING


def test_expired_scratch_is_reported_then_deleted_after_the_grace(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit, tmp_path: Path
) -> None:
    text = CLUSTER.read_text().replace(
        "  - name: me\n", "  - name: me\n    scratch_expiry: 10s\n    scratch_grace: 5s\n"
    )
    cluster = load_cluster_text(text)
    loop = make_loop()
    ended = submit("print('done')")
    running = submit("import time; time.sleep(30)")
    loop.cycle()
    assert run_until(loop, sessions, ended, {S.SUCCEEDED}) is S.SUCCEEDED
    assert run_until(loop, sessions, running, {S.RUNNING}) is S.RUNNING
    root = loop.work_root
    done_dir = attempt_dir(root, "me", ended, 1)
    live_dir = attempt_dir(root, "me", running, 1)
    assert done_dir.is_dir() and live_dir.is_dir()
    with sessions() as db:
        attempt = db.get(Attempt, (ended, 1))
        assert attempt is not None and attempt.end_time is not None
        end = attempt.end_time

    def expire(at: float) -> list[tuple[str, str]]:
        return [(a.action, a.job_id) for a in expire_scratch(sessions, cluster, root, at)]

    assert expire(end + 5) == []  # not expired yet
    assert expire(end + 11) == [("report", ended)]
    assert expire(end + 12) == []  # reported; the grace runs
    assert done_dir.is_dir()
    assert expire(end + 17) == [("delete", ended)]
    assert not done_dir.exists() and live_dir.is_dir()
    assert expire(end + 100) == []
    with sessions() as db:
        [report] = list_records(db, action="scratch.report")
        [deleted] = list_records(db, action="scratch.delete")
    assert report.object == deleted.object == ended
    assert report.detail["path"] == str(done_dir.relative_to(root))
    assert [e.kind for e in events(sessions, "scratch_report")] == ["scratch_report"]


def test_a_long_cleaned_history_never_hides_newer_expired_scratch(
    sessions: sessionmaker[Session], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts whose directories are gone are passed over once for good (the cursor),
    so a tenant with more of them than one pass reads still gets newer ones cleaned."""
    from allotment.domain.job import JobSpec
    from allotment.store.jobs import create_job
    from allotment.upkeep import scratch

    monkeypatch.setattr(scratch, "BATCH", 2)
    cluster = load_cluster_text(
        "pools: [{name: p}]\ntenants: [{name: me, scratch_expiry: 10s, scratch_grace: 5s}]\n"
        "queues: [{name: q, tenant: me}]\n"
    )
    root = tmp_path / "work"
    spec = JobSpec.model_validate({"name": "t", "queue": "q", "replicas": [{"count": 1}]})
    ids = []
    with sessions.begin() as db:
        for i in range(5):  # ended at 100, 101, ...: only the newest still has its directory
            job = create_job(db, spec, tenant="me", user="me", at=0.0, priority_class="training")
            job.state = JobState.SUCCEEDED.value
            db.add(Attempt(job_id=job.id, number=1, state="succeeded", end_time=100.0 + i))
            ids.append(job.id)
    newest = attempt_dir(root, "me", ids[-1], 1)
    newest.mkdir(parents=True)
    cursors: dict[str, scratch.Cursor] = {}
    passes = [expire_scratch(sessions, cluster, root, 200.0, cursors) for _ in range(3)]
    assert [[(a.action, a.job_id) for a in p] for p in passes] == [[], [], [("report", ids[-1])]]
    assert not expire_scratch(sessions, cluster, root, 200.0)  # without the cursor: hidden
