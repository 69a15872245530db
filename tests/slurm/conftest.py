"""A real Slurm cluster (one controller, three GPU nodes, in a private network
namespace) for the whole ``tests/slurm`` session, and a control loop on it with a real
SQLite store. Every test leaves the cluster with no job and every node up."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.loop import ControlLoop
from allotment.domain.cluster import Cluster
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.executors.slurm import SlurmExecutor
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.jobs import create_job, get_job, transition_job
from allotment.store.models import Event
from tests.server.conftest import up as up
from tests.slurm.cluster import NODES, SlurmCluster, install, missing_tools


def cluster_yaml(
    bin_dir: Path, *, retry: str = "{max_attempts: 3, on: [node_failure, preempted], backoff: 0s}"
) -> str:
    return f"""
pools:
  - {{name: a100, price_per_gpu_hour: 2.5}}
  - {{name: h100, price_per_gpu_hour: 4}}
tenants:
  - {{name: me, members: [{{user: me, role: admin}}]}}
queues:
  - name: research
    tenant: me
    quota: {{a100: {{gpu: 8, cpu: 16, memory: 32000Mi}}, h100: {{gpu: 2, cpu: 8, memory: 16000Mi}}}}
    retry: {retry}
executor:
  kind: slurm
  slurm:
    partition: gpu
    bin_dir: {bin_dir}
    export_env: [LD_LIBRARY_PATH, SLURM_CONF]
    pools:
      a100: {{gres_type: a100}}
      h100: {{gres_type: h100}}
"""


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    missing = missing_tools()
    if missing:
        pytest.skip(f"a test Slurm cluster needs {', '.join(missing)}")
    root = install()
    base = Path(tempfile.mkdtemp(prefix="allotment-slurm-"))
    cluster = SlurmCluster(base=base, root=root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def clean(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, emptied of jobs (and with every node back) after the test."""
    yield slurm
    slurm.run("scancel", "--full", "-u", "root", check=False)
    for name in NODES:
        if name not in slurm.nodes:
            slurm.start_node(name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        busy = slurm.run("squeue", "-h", "-t", "PD,R,CG", "-o", "%i", check=False).stdout.strip()
        states = slurm.node_states()
        if (
            not busy
            and all(s in ("idle", "planned") for s in states.values())
            and len(states) == len(NODES)
        ):
            return
        if any(s.startswith("down") for s in states.values()):
            slurm.run(
                "scontrol", "update", f"nodename={','.join(NODES)}", "state=resume", check=False
            )
        time.sleep(0.3)
    raise AssertionError(f"the Slurm cluster did not settle: {slurm.node_states()}")


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def cluster(clean: SlurmCluster) -> Cluster:
    return load_cluster_text(cluster_yaml(clean.bin_dir), source="test")


MakeLoop = Callable[[], ControlLoop]


@pytest.fixture
def make_loop(cluster: Cluster, sessions: sessionmaker[Session], tmp_path: Path) -> MakeLoop:
    """A new loop and a new Slurm executor on the same store each call (a restart)."""

    def make() -> ControlLoop:
        assert cluster.executor.slurm is not None
        executor = SlurmExecutor(
            cluster.executor.slurm, tmp_path / "slurm-state", runtime=cluster.runtime
        )
        return ControlLoop(
            cluster,
            sessions,
            executor,
            work_root=tmp_path / "work",
            clock=time.time,
            stop_grace_s=2.0,
        )

    return make


Submit = Callable[..., str]


@pytest.fixture
def submit(sessions: sessionmaker[Session]) -> Submit:
    def submit(
        command: list[str],
        *,
        replicas: int = 1,
        gpu: int = 1,
        pool: str = "a100",
        priority_class: str = "training",
        fields: dict[str, Any] | None = None,
    ) -> str:
        spec = JobSpec.model_validate(
            {
                "name": "t",
                "queue": "research",
                "replicas": [
                    {"count": replicas, "resources": {"gpu": gpu, "cpu": 1, "memory": "100Mi"}}
                ],
                "pools": [pool],
                "command": command,
                "priority_class": priority_class,
                **(fields or {}),
            }
        )
        now = time.time()
        with sessions.begin() as db:
            job = create_job(
                db, spec, tenant="me", user="me", at=now, priority_class=priority_class
            )
            transition_job(db, job.id, JobState.PENDING, at=now, message="accepted")
            return job.id

    return submit


def state_of(sessions: sessionmaker[Session], job_id: str) -> JobState:
    with sessions() as db:
        return JobState(get_job(db, job_id).state)


def drive(loop: ControlLoop, done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Observe and cycle until ``done()``; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loop.observe()
        loop.cycle()
        if done():
            return
        time.sleep(0.2)
    with loop.store_sessions() as db:
        events = [
            f"{e.job_id} {e.kind} {e.to_state or ''} {e.message} {e.detail}"
            for e in db.scalars(select(Event).order_by(Event.id))
        ]
    raise AssertionError(f"not reached within {timeout}s: {what}; events:\n" + "\n".join(events))
