"""The ``services`` table: create or update a service, read it, delete it, and add a
replica job to it. The service controller (:mod:`allotment.control.services`) is the
only writer of a service's replicas and status; the API writes specs and deletions.

A replica record (an item of ``Service.replicas``) is ``{"job": id, "generation": n,
"port": p, "ready": bool, "started": t | None}``.
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from allotment.domain.errors import NotFound
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import ALLOWED, JobState
from allotment.domain.service import PORT_ENV
from allotment.store.jobs import cancel_job, create_job, jobs_by_id
from allotment.store.models import Job, Service

SERVICE_ENV = "ALLOTMENT_SERVICE"
"""The variable that names a replica's service."""


def new_service_id() -> str:
    return f"svc-{secrets.token_hex(8)}"


def settings_of(service: Service) -> JobSpec:
    """The service's spec (its job file, checked when it was applied)."""
    return JobSpec.model_validate(service.spec)


def apply_service(
    session: Session,
    spec: JobSpec,
    *,
    tenant: str,
    user: str,
    priority_class: str,
    at: float,
) -> tuple[Service, bool]:
    """Create the service ``spec`` describes in ``tenant``, or update the one of that
    name (a new generation when the spec changed: the controller rolls its replicas
    over). Return the row and whether anything changed."""
    assert spec.service is not None
    dumped = spec.model_dump(mode="json")
    found = find_service(session, tenant, spec.name, for_update=True)
    if found is None:
        service = Service(
            id=new_service_id(),
            name=spec.name,
            tenant=tenant,
            queue=spec.queue,
            user=user,
            priority_class=priority_class,
            spec=dumped,
            generation=1,
            desired=spec.service.replicas.min,
            replicas=[],
            failures=0,
            restarts=0,
            next_start_at=None,
            reason_code="starting",
            reason_message="waiting for its first replica to become ready",
            created_at=at,
            updated_at=at,
        )
        session.add(service)
        session.flush()
        return service, True
    if found.spec == dumped and found.priority_class == priority_class:
        return found, False
    found.spec = dumped
    found.queue = spec.queue
    found.user = user
    found.priority_class = priority_class
    found.generation += 1
    found.failures = 0
    found.next_start_at = None
    found.desired = max(spec.service.replicas.min, min(found.desired, spec.service.replicas.max))
    found.updated_at = at
    session.flush()
    return found, True


def find_service(
    session: Session, tenant: str, name: str, *, for_update: bool = False
) -> Service | None:
    """The service ``name`` of ``tenant``, or ``None``."""
    query = select(Service).where(Service.tenant == tenant, Service.name == name)
    if for_update:
        query = query.with_for_update()
    return session.scalars(query).first()


def get_service(session: Session, tenant: str, name: str, *, for_update: bool = False) -> Service:
    """The service ``name`` of ``tenant``; raises :class:`NotFound`."""
    found = find_service(session, tenant, name, for_update=for_update)
    if found is None:
        raise NotFound("service", name)
    return found


def list_services(session: Session, *, tenant: str | None = None) -> list[Service]:
    """Every service (only ``tenant``'s when given), by tenant and name."""
    query = select(Service).order_by(Service.tenant, Service.name)
    if tenant is not None:
        query = query.where(Service.tenant == tenant)
    return list(session.scalars(query))


def replica_jobs(session: Session, service: Service) -> dict[str, Job]:
    """The service's replica jobs, by id."""
    return {job.id: job for job in jobs_by_id(session, [r["job"] for r in service.replicas])}


def delete_service(session: Session, service: Service, *, at: float, by: str | None) -> None:
    """Cancel every replica job of ``service`` that has not ended, and delete it."""
    for job in replica_jobs(session, service).values():
        if JobState.CANCELLED in ALLOWED[JobState(job.state)]:
            cancel_job(session, job.id, at=at, by=by)
    session.delete(service)
    session.flush()


def protected_replicas(session: Session) -> set[str]:
    """The replica jobs idle and TTL reaping must never stop: each service's first
    ``min`` live replicas (those made as its minimum first, then ready ones, then the
    oldest). Those above the minimum may be reaped; the autoscaler also scales them
    down when the load falls."""
    protected: set[str] = set()
    for service in session.scalars(select(Service)):
        spec = settings_of(service)
        assert spec.service is not None
        live = [r for r in service.replicas if not r.get("retired")]
        live.sort(key=lambda r: (bool(r.get("preemptible")), not r.get("ready")))
        protected.update(r["job"] for r in live[: spec.service.replicas.min])
    return protected


def add_replica(
    session: Session,
    service: Service,
    *,
    port: int,
    at: float,
    not_before: float | None,
    preemptible: bool,
) -> dict[str, Any]:
    """A new replica job of ``service`` (pending: the scheduler places it like any job),
    told to listen on ``port``; ``preemptible`` for one above the service's minimum
    (a victim even where its class is not). Return its replica record (the caller keeps
    it in ``service.replicas``)."""
    spec = settings_of(service)
    env = {**spec.env, PORT_ENV: str(port), SERVICE_ENV: service.name}
    replica = spec.model_copy(update={"env": env, "preemptible": preemptible or spec.preemptible})
    job = create_job(
        session,
        replica,
        tenant=service.tenant,
        user=service.user,
        at=at,
        priority_class=service.priority_class,
        not_before=not_before,
        accepted=f"replica of service {service.name} (generation {service.generation})",
    )
    record: dict[str, Any] = {
        "job": job.id,
        "generation": service.generation,
        "port": port,
        "ready": False,
        "started": None,
        "preemptible": preemptible,
    }
    return record
