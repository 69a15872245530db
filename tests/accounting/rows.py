"""Rows written straight into the store for accounting tests: jobs, attempts, events
and ``job_usage`` samples, as the control loop and the sampler would leave them."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from allotment.domain.resources import MILLI
from allotment.store.jobs import TRANSITION
from allotment.store.models import Attempt, Event, Job, JobUsage

GI = 2**30


def job(
    session: Session,
    job_id: str,
    *,
    tenant: str,
    queue: str,
    user: str = "alice",
    type: str = "training",
    priority_class: str = "training",
    state: str = "running",
    submit_time: float = 0.0,
) -> None:
    session.add(
        Job(
            id=job_id,
            name=job_id,
            tenant=tenant,
            queue=queue,
            user=user,
            type=type,
            priority_class=priority_class,
            spec={},
            state=state,
            failure_class=None,
            attempt=0,
            submit_time=submit_time,
            created_at=submit_time,
            updated_at=submit_time,
        )
    )
    session.flush()


def attempt(
    session: Session,
    job_id: str,
    number: int,
    *,
    pool: str,
    start: float,
    end: float | None,
    gpus: float = 1,
    cpu: float = 0,
    memory_gib: float = 0,
    replicas: int = 1,
    state: str = "running",
    failure_class: str | None = None,
) -> None:
    """An attempt of ``replicas`` replicas, each holding ``gpus``, ``cpu``, ``memory_gib``."""
    resources: dict[str, Any] = {
        "gpu": round(gpus * MILLI),
        "cpu": round(cpu * MILLI),
        "memory": round(memory_gib * GI * MILLI),
    }
    session.add(
        Attempt(
            job_id=job_id,
            number=number,
            state=state,
            start_time=start,
            end_time=end,
            failure_class=failure_class,
            pool=pool,
            allocation=[
                {"group": "worker", "index": i, "node": "n1", "resources": resources, "devices": []}
                for i in range(replicas)
            ],
            borrowed={},
        )
    )
    session.flush()


def usage(
    session: Session, job_id: str, number: int, *, start: float, length: float, util: float | None
) -> None:
    session.add(
        JobUsage(
            job_id=job_id,
            attempt=number,
            interval_start=start,
            interval_s=length,
            samples=1 if util is not None else 0,
            gpus=1,
            gpu_util_avg=util,
        )
    )
    session.flush()


def event(
    session: Session,
    job_id: str,
    at: float,
    to_state: str,
    *,
    message: str = "",
    detail: dict[str, Any] | None = None,
) -> None:
    session.add(
        Event(
            job_id=job_id,
            at=at,
            kind=TRANSITION,
            from_state=None,
            to_state=to_state,
            message=message,
            detail=detail or {},
        )
    )
    session.flush()
