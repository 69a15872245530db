"""The ``/api/v1`` routes. Thin: parse, call the service with keywords, return a schema."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from allotment.api import schemas
from allotment.api.service import JobService
from allotment.domain.lifecycle import JobState

MAX_PAGE = 500

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.ErrorOut} for code in (404, 413, 422, 500)
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


@router.post("/jobs:batch", status_code=201, response_model=schemas.JobList)
def submit_jobs(body: schemas.SubmitManyRequest, svc: Service) -> schemas.JobList:
    return schemas.JobList(jobs=svc.submit_many(spec_texts=body.specs))


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


@router.get("/jobs/{job_id}/events", response_model=schemas.EventList)
def job_events(job_id: str, svc: Service) -> schemas.EventList:
    return svc.events(job_id=job_id)


@router.get("/queues", response_model=schemas.QueueTree)
def queues(svc: Service) -> schemas.QueueTree:
    return svc.queues()


@router.get("/healthz", response_model=schemas.Health)
def healthz() -> schemas.Health:
    return schemas.Health(status="ok")
