"""The ``/api/v1`` routes. Thin: parse, call the service with keywords, return a schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Query, Request

from allotment.api import audit, schemas
from allotment.api.logs import MAX_CHUNK
from allotment.api.service import JobService
from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import JobState

MAX_PAGE = 500
MAX_ID = 2**63 - 1
MAX_OFFSET = 2**62
MAX_ATTEMPT = 2**31 - 1
DEFAULT_LOG_CHUNK = 64 * 1024

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.ErrorOut} for code in (400, 404, 409, 413, 422, 500)
}

router = APIRouter(prefix="/api/v1", responses=ERRORS)


def service(request: Request) -> JobService:
    svc = request.app.state.service
    assert isinstance(svc, JobService)
    return svc


Service = Annotated[JobService, Depends(service)]


@router.post("/jobs", status_code=201, response_model=schemas.JobOut)
def submit_job(body: schemas.SubmitRequest, svc: Service) -> schemas.JobOut:
    return svc.submit(spec_text=body.spec)


@router.get("/jobs", response_model=schemas.JobPage)
def list_jobs(
    svc: Service,
    queue: str | None = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: str | None = None,
) -> schemas.JobPage:
    return svc.list(queue=queue, states=state, limit=limit, after=after)


@router.get("/jobs/{job_id}", response_model=schemas.JobOut)
def get_job(job_id: str, svc: Service) -> schemas.JobOut:
    return svc.get(job_id=job_id)


@router.post("/jobs/{job_id}/cancel", response_model=schemas.JobOut)
def cancel_job(job_id: str, svc: Service) -> schemas.JobOut:
    return svc.cancel(job_id=job_id)


@router.get("/jobs/{job_id}/events", response_model=schemas.EventList)
def job_events(job_id: str, svc: Service) -> schemas.EventList:
    return svc.events(job_id=job_id)


@router.get("/jobs/{job_id}/why", response_model=schemas.WhyOut)
def why(job_id: str, svc: Service) -> schemas.WhyOut:
    return svc.why(job_id=job_id)


@router.get("/jobs/{job_id}/logs", response_model=schemas.LogChunk)
def logs(
    job_id: str,
    svc: Service,
    replica: str | None = None,
    stream: Literal["out", "err"] = "out",
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_CHUNK)] = DEFAULT_LOG_CHUNK,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_ATTEMPT)] = None,
) -> schemas.LogChunk:
    return svc.logs(
        job_id=job_id, attempt=attempt, replica=replica, stream=stream, offset=offset, limit=limit
    )


@router.get("/queues", response_model=schemas.QueueUsageTree)
def queues(svc: Service) -> schemas.QueueUsageTree:
    return svc.queues()


@router.get("/pools", response_model=schemas.PoolList)
def pools(svc: Service) -> schemas.PoolList:
    return svc.pools()


@router.get("/nodes", response_model=schemas.NodeList)
def nodes(svc: Service) -> schemas.NodeList:
    return svc.nodes()


@router.get("/cluster", response_model=schemas.ClusterText)
def cluster(svc: Service) -> schemas.ClusterText:
    return svc.cluster_text()


@router.put("/cluster", response_model=schemas.ClusterApplied)
def apply_cluster(
    body: Annotated[schemas.ClusterApply, Body()], request: Request, svc: Service
) -> schemas.ClusterApplied:
    hook: Callable[[Cluster], None] | None = getattr(request.app.state, "on_cluster_change", None)
    return svc.apply_cluster(text=body.text, dry_run=body.dry_run, on_change=hook)


@router.get("/audit", response_model=schemas.AuditPage)
def audit_records(
    request: Request,
    svc: Service,
    user: str | None = None,
    tenant: str | None = None,
    action: str | None = None,
    object: str | None = None,
    since: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    until: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
) -> schemas.AuditPage:
    """Audit records by id, filtered; a tenant's principal sees only its tenant's."""
    _, visible = audit.principal_of(request.state)
    return audit.list_audit(
        svc.sessions,
        visible_tenant=visible,
        user=user,
        tenant=tenant,
        action=action,
        object=object,
        since=since,
        until=until,
        after=after,
        limit=limit,
    )


@router.get("/audit/verify", response_model=schemas.AuditVerifyOut)
def audit_verify(svc: Service) -> schemas.AuditVerifyOut:
    """Check the audit chain; name the first edited, deleted or reordered record."""
    return audit.verify_audit(svc.sessions)


@router.get("/healthz", response_model=schemas.Health)
def healthz() -> schemas.Health:
    return schemas.Health(status="ok")
