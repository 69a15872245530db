"""The housekeeper beside the loop runner: started and stopped with it, sampling real
replicas, surviving a failing step, and waking the loop after a reaping."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.loop import ControlLoop
from allotment.control.runner import LoopRunner
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.store.models import Event, JobUsage
from allotment.upkeep.housekeeper import Housekeeper, housekeeper_for
from tests.control.conftest import CLUSTER, MakeLoop, Submit, state_of, wait_until

POLICY = """
telemetry: {source: fake, file: gpus.json, interval: 0.1s, aggregate: 0.5s}
"""


def keeper_beside(loop: ControlLoop, runner: LoopRunner, base: Path) -> Housekeeper:
    """A housekeeper for ``loop``, as the server builds one beside its runner."""
    return housekeeper_for(
        loop.state.current,
        loop.store_sessions,
        usage=loop.executor.usage,
        clock=loop.clock,
        work_root=loop.work_root,
        orphan_gpus=loop.orphans.gpu_processes,
        wake=runner.wake,
        lock=runner.lock,
        base=base,
    )


def test_the_housekeeper_samples_and_reaps_beside_the_runner(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit, tmp_path: Path
) -> None:
    text = CLUSTER.read_text() + POLICY
    text = text.replace(
        "  - name: workstation\n",
        "  - name: workstation\n    reaping: {types: {notebook: {ttl: 1s}}}\n",
    )
    loop = make_loop()
    loop.state.apply(load_cluster_text(text))
    assert loop.sync()
    (tmp_path / "gpus.json").write_text(json.dumps({"localhost/0": {"utilization": 50}}))
    runner = LoopRunner(loop, tick_s=5.0)  # long ticks: only a wake-up turns it quickly
    keeper = keeper_beside(loop, runner, tmp_path)
    failures = iter([RuntimeError("one bad step")])
    real_step = keeper.step

    def step():  # type: ignore[no-untyped-def]
        for exc in failures:
            raise exc
        return real_step()

    keeper.step = step  # type: ignore[method-assign]
    runner.companions.append(keeper)
    runner.start()
    try:
        job_id = submit("import time; time.sleep(60)", fields={"type": "notebook"})
        runner.wake()
        # It runs, then is reaped past its time to live. Running may last only until the
        # housekeeper's next step (on a busy machine the loop marks it running at its
        # next tick, when it has run 5 s already), so its history says it ran.
        wait_until(lambda: state_of(sessions, job_id) is JobState.RECLAIMED, "reclaimed")
        with sessions() as db:
            moves = db.scalars(
                select(Event.to_state)
                .where(Event.job_id == job_id, Event.kind == "transition")
                .order_by(Event.id)
            ).all()
        running, reclaimed = JobState.RUNNING.value, JobState.RECLAIMED.value
        assert running in moves and moves.index(running) < moves.index(reclaimed), moves
        # The reclamation woke the loop: the replica stops well before the next tick.
        started = time.monotonic()
        wait_until(
            lambda: not any(not s.ended for s in loop.executor.observe().values()),
            "stopped",
            timeout=4.0,
        )
        assert time.monotonic() - started < 4.0
        assert keeper.failures == 1 and keeper.steps > 1
        assert keeper.reaped == {"ttl": 1}
        with sessions() as db:
            rows = db.scalars(select(JobUsage).where(JobUsage.job_id == job_id)).all()
        assert rows and all(r.gpu_util_max == 50 for r in rows if r.gpu_util_max is not None)
        assert any(r.memory_max for r in rows)  # the replica's resident memory
    finally:
        runner.stop()
    assert not runner.alive


def test_a_notebooks_own_ttl_reaps_it_where_its_queue_sets_no_policy(
    make_loop: MakeLoop, sessions: sessionmaker[Session], submit: Submit, tmp_path: Path
) -> None:
    loop = make_loop()
    loop.state.apply(load_cluster_text(CLUSTER.read_text() + POLICY))
    assert loop.sync()
    (tmp_path / "gpus.json").write_text(json.dumps({"localhost/0": {"utilization": 50}}))
    runner = LoopRunner(loop, tick_s=0.2)
    keeper = keeper_beside(loop, runner, tmp_path)
    runner.companions.append(keeper)
    runner.start()
    try:
        sleep = "import time; time.sleep(60)"
        own = submit(sleep, fields={"type": "notebook", "notebook": {"ttl": "1s"}})
        other = submit(sleep, fields={"type": "notebook"})  # no limit of its own
        runner.wake()
        wait_until(lambda: state_of(sessions, own) is JobState.RECLAIMED, "reaped")
        assert state_of(sessions, other) is JobState.RUNNING
        # Counted once its transaction has committed: the store may show it first.
        wait_until(lambda: keeper.reaped == {"ttl": 1}, "counted")
        assert keeper.reaped == {"ttl": 1}
        with sessions() as db:
            event = db.scalars(
                select(Event).where(Event.job_id == own, Event.kind == "transition")
            ).all()[-1]
        assert "time to live of 1s" in event.message and event.detail["reason"] == "ttl"
    finally:
        runner.stop()
