"""The telemetry sampler's aggregation into ``job_usage`` and ``device_usage``, its
retention, and idle reclamation's reads and writes, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import ReplicaKey, ReplicaUsage
from allotment.store.audit import list_records, verify_chain
from allotment.store.jobs import create_job, get_job, transition_job
from allotment.store.models import Alert, Attempt, DeviceUsage, Event, JobUsage
from allotment.telemetry.sources import FakeSource
from allotment.upkeep import reaping
from allotment.upkeep.sampler import Sampler

GIB = 1024**3


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def running_job(
    sessions: sessionmaker[Session],
    devices: list[int],
    *,
    job_type: str = "notebook",
    started: float = 1000.0,
    queue: str = "q",
) -> str:
    spec = JobSpec.model_validate(
        {
            "name": "nb",
            "queue": queue,
            "type": job_type,
            "replicas": [{"count": 1, "resources": {"gpu": len(devices)}}],
            "command": ["true"],
        }
    )
    with sessions.begin() as db:
        job = create_job(db, spec, tenant="t", user="u", at=started, priority_class="training")
        for state in (JobState.PENDING, JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
            transition_job(db, job.id, state, at=started, message=state.value)
        job.attempt = 1
        db.add(
            Attempt(
                job_id=job.id,
                number=1,
                state="running",
                start_time=started,
                pool="p",
                allocation=[
                    {
                        "group": "worker",
                        "index": 0,
                        "node": "box",
                        "resources": {},
                        "devices": devices,
                    }
                ],
                borrowed={},
            )
        )
        return job.id


def readings_file(tmp_path: Path, values: Mapping[str, object]) -> Path:
    import json

    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(values))
    return path


def test_samples_are_folded_per_interval_and_pruned_after_the_retention(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    job_id = running_job(sessions, [0, 1])
    key = ReplicaKey(job_id, 1, "worker", 0)
    file = readings_file(
        tmp_path,
        {
            "box/0": {"utilization": 10, "memory": "1Gi"},
            "box/1": {"utilization": 30, "memory": GIB},
        },
    )
    usage = {key: ReplicaUsage(cpu_cores=2.0, memory_bytes=100, pids=(1,))}
    clock = Clock(1200.0)
    sampler = Sampler(
        FakeSource(file),
        sessions,
        usage=lambda: usage,
        clock=clock,
        aggregate_s=60.0,
        retention_s=3600.0,
    )
    seen = sampler.sample()
    assert [h.job_id for h in seen.holdings] == [job_id]
    clock.now = 1210.0
    readings_file(tmp_path, {"box/0": {"utilization": 50}, "box/1": {"utilization": 70}})
    usage = {key: ReplicaUsage(cpu_cores=4.0, memory_bytes=300, pids=(1,))}
    sampler.sample()
    clock.now = 1265.0  # the next interval
    sampler.sample()
    with sessions() as db:
        [first, second] = db.scalars(select(JobUsage).order_by(JobUsage.interval_start)).all()
        devices = db.scalars(
            select(DeviceUsage)
            .where(DeviceUsage.interval_start == 1200.0)
            .order_by(DeviceUsage.device)
        ).all()
    assert (first.interval_start, first.interval_s, first.samples, first.gpus) == (
        1200.0,
        60.0,
        2,
        2,
    )
    assert first.gpu_util_avg == pytest.approx(40.0)  # (20 + 60) / 2
    assert first.gpu_util_max == pytest.approx(70.0)  # the busiest device, box/1 at 70
    assert first.gpu_memory_max == 2 * GIB
    assert first.cpu_avg == pytest.approx(3.0) and first.memory_max == 300
    assert (second.interval_start, second.samples) == (1260.0, 1)
    assert [(d.device, d.samples, d.util_avg, d.util_max) for d in devices] == [
        (0, 2, 30.0, 50.0),
        (1, 2, 50.0, 70.0),
    ]
    clock.now = 1260.0 + 3600.0 + 1
    assert sampler.prune() == 3  # the first interval's job row and its two device rows
    with sessions() as db:
        left = db.scalars(select(JobUsage)).all()
    assert [r.interval_start for r in left] == [1260.0]


def test_a_broken_readings_file_gives_no_readings_and_no_error(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    assert FakeSource(path).read() == []
    path.write_text("{box/0: {utilisation: 3}}")
    assert FakeSource(path).read() == []
    path.write_text("box/0: {utilization: 3, pids: [7]}\n")
    [reading] = FakeSource(path).read()
    assert (reading.node, reading.device, reading.utilization, reading.pids) == (
        "box",
        0,
        3.0,
        (7,),
    )


CLUSTER = """
pools: [{name: p}]
nodes: [{name: box, pool: p, capacity: {gpu: 2}}]
tenants: [{name: t}]
queues:
  - name: q
    tenant: t
    reaping:
      idle: {threshold: 5%, window: 20s, warn_before: 10s}
"""


@pytest.mark.parametrize("webhook", [None, "http://127.0.0.1:9/hook"])
def test_an_idle_job_is_warned_then_reclaimed_with_its_evidence(
    sessions: sessionmaker[Session], tmp_path: Path, webhook: str | None
) -> None:
    text = CLUSTER
    if webhook is not None:
        text = text.replace(
            "tenants: [{name: t}]", f"tenants: [{{name: t, webhook: {{url: '{webhook}'}}}}]"
        )
    cluster = load_cluster_text(text)
    job_id = running_job(sessions, [0])
    busy = running_job(sessions, [1])
    file = readings_file(tmp_path, {"box/0": {"utilization": 1}, "box/1": {"utilization": 80}})
    clock = Clock(1000.0)
    sampler = Sampler(
        FakeSource(file), sessions, usage=dict, clock=clock, aggregate_s=1.0, retention_s=1e6
    )

    def step() -> list[reaping.Decision]:
        sampler.sample()
        with sessions.begin() as db:
            decisions = reaping.gather(db, cluster, clock.now)
            return reaping.apply(db, decisions, clock.now, cluster.webhook_of)

    done: list[tuple[float, str]] = []
    while clock.now < 1040.0 and not any(a == "reap" for _, a in done):
        done += [(clock.now, d.action) for d in step() if d.job_id == job_id]
        assert not any(d.job_id == busy for d in step())
        clock.now += 0.5
    warned_at = next(t for t, a in done if a == "warn")
    reclaimed_at = next(t for t, a in done if a == "reap")
    assert warned_at >= 1000.0 + 10.0  # after window - warn_before of idleness
    assert reclaimed_at >= max(1000.0 + 20.0, warned_at + 10.0)
    with sessions() as db:
        job = get_job(db, job_id)
        assert (job.state, job.failure_class) == ("reclaimed", "reclaimed")
        attempt = db.get(Attempt, (job_id, 1))
        assert attempt is not None and attempt.state == "reclaimed"
        [event] = db.scalars(
            select(Event).where(Event.job_id == job_id, Event.to_state == "reclaimed")
        ).all()
        assert event.detail["reason"] == "idle" and event.detail["samples"]
        assert all(s["gpu_util_max"] < 5 for s in event.detail["samples"])
        [alert] = db.scalars(select(Alert).where(Alert.job_id == job_id)).all()
        delivery = "none" if webhook is None else "pending"  # the tenant's webhook gets it
        assert (alert.kind, alert.delivery, alert.tenant) == ("idle_warning", delivery, "t")
        assert alert.webhook == webhook
        [record] = list_records(db, action="job.reap")
        assert (record.user, record.object, record.tenant) == ("allotment", job_id, "t")
        assert record.detail["reason"] == "idle" and record.detail["samples"]
        assert verify_chain(db) is None
        assert get_job(db, busy).state == "running"
