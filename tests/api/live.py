"""A live stack for read-side tests: the real API server (uvicorn on 127.0.0.1) over a
store, with a real control loop and the real local executor driven by the test.

The loop is not run in a thread: tests call :meth:`Live.step` to cycle and observe, so
what the API answers depends only on what the test did. Every replica process started
is killed, and the server stopped, when the block ends.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.app import create_app
from allotment.api.auth import Authenticator
from allotment.control.cluster_state import ClusterState
from allotment.control.loop import ControlLoop
from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster
from allotment.executors.local import LocalExecutor
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.jobs import get_job
from tests.api.conftest import EXAMPLES, serve
from tests.executors.processes import kill_everything

PY = sys.executable


@dataclass
class Live:
    url: str
    loop: ControlLoop
    sessions: sessionmaker[Session]
    work_root: Path
    applied: list[Cluster] = field(default_factory=list)
    """Clusters the app's ``on_cluster_change`` hook was given."""

    def state(self, job_id: str) -> JobState:
        with self.sessions() as db:
            return JobState(get_job(db, job_id).state)

    def step(self) -> None:
        self.loop.observe()
        self.loop.cycle()

    def until(self, job_id: str, states: set[JobState], timeout: float = 15.0) -> JobState:
        """Cycle and observe until the job is in one of ``states``."""
        deadline = time.monotonic() + timeout
        state = self.state(job_id)
        while time.monotonic() < deadline:
            self.step()
            state = self.state(job_id)
            if state in states:
                return state
            time.sleep(0.05)
        raise AssertionError(f"{job_id} did not reach {states}; last state {state}")


def job_text(
    code: str,
    *,
    gpus: int = 1,
    queue: str = "default",
    name: str = "t",
    expected_runtime: str | None = None,
) -> str:
    """A job file (JSON text) running ``python -c code``."""
    import json

    spec: dict[str, object] = {
        "name": name,
        "queue": queue,
        "replicas": [{"count": 1, "resources": {"gpu": gpus, "cpu": 1, "memory": "1Gi"}}],
        "command": [PY, "-c", code],
    }
    if expected_runtime is not None:
        spec["expected_runtime"] = expected_runtime
    return json.dumps(spec)


@contextmanager
def live_stack(
    tmp_path: Path,
    engine: Engine | None = None,
    *,
    cluster: Cluster | None = None,
    authenticator: Callable[[sessionmaker[Session]], Authenticator] | None = None,
) -> Iterator[Live]:
    """The stack on ``engine`` (default: a fresh SQLite file in ``tmp_path``) for
    ``cluster`` (default: the local example); ``authenticator`` builds the app's from
    the store's sessions (default: none, every request a platform admin)."""
    own = engine is None
    if engine is None:
        engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    if cluster is None:
        cluster = load_cluster(EXAMPLES / "cluster-local.yaml")
    work_root = tmp_path / "work"
    state_root = tmp_path / "state"
    executor = LocalExecutor(state_root)
    shared = ClusterState(cluster)  # as in the server: one owner, read by loop and API
    loop = ControlLoop(
        shared, sessions, executor, work_root=work_root, clock=time.time, stop_grace_s=1.0
    )
    app = create_app(
        cluster=shared,
        store_sessions=sessions,
        clock=time.time,
        work_root=work_root,
        authenticator=authenticator(sessions) if authenticator is not None else None,
    )
    live = Live(url="", loop=loop, sessions=sessions, work_root=work_root)
    app.state.on_cluster_change = live.applied.append
    try:
        with serve(app) as url:
            live.url = url
            try:
                yield live
            finally:
                kill_everything(state_root)
                for child in executor._children.values():
                    with contextlib.suppress(Exception):
                        child.wait(timeout=5)
    finally:
        if own:
            engine.dispose()
