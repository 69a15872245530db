"""The ``/api/v1`` routes. Thin: parse, authorise, call the service with keywords, return
a schema.

Every route of :data:`router` needs an authenticated principal; each names the one
:class:`~allotment.api.policy.Action` it performs (``allowed``/``on_job``), and listings
pass the principal's :func:`~allotment.api.policy.visible_tenant` to the query.
:data:`open_router` holds the routes that need no token (the health check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from allotment.api import audit, reports, schemas, whatif
from allotment.api.access import (
    CurrentPrincipal,
    Service,
    ServiceBook,
    Tokens,
    allowed,
    on_job,
    on_service,
    principal,
)
from allotment.api.alerts import alerts_page
from allotment.api.auth import Principal
from allotment.api.images import images_view
from allotment.api.logs import MAX_CHUNK
from allotment.api.policy import Action, Owned, require, visible_tenant
from allotment.api.services import ServiceList, ServiceOut
from allotment.domain.cluster import Cluster, Queue
from allotment.domain.lifecycle import JobState

MAX_PAGE = 500
MAX_ID = 2**63 - 1
MAX_OFFSET = 2**62
MAX_ATTEMPT = 2**31 - 1
DEFAULT_LOG_CHUNK = 64 * 1024

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.ErrorOut} for code in (400, 401, 403, 404, 409, 413, 422, 500)
}

router = APIRouter(prefix="/api/v1", responses=ERRORS, dependencies=[Depends(principal)])
open_router = APIRouter(prefix="/api/v1", responses=ERRORS)

Reader = Annotated[Principal, Depends(on_job(Action.JOB_READ))]
Canceller = Annotated[Principal, Depends(on_job(Action.JOB_CANCEL))]
JobLister = Annotated[Principal, Depends(allowed(Action.JOB_READ))]
QueueReader = Annotated[Principal, Depends(allowed(Action.QUEUE_READ))]
FleetReader = Annotated[Principal, Depends(allowed(Action.FLEET_READ))]
ClusterReader = Annotated[Principal, Depends(allowed(Action.CLUSTER_READ))]
ClusterApplier = Annotated[Principal, Depends(allowed(Action.CLUSTER_APPLY))]
AuditReader = Annotated[Principal, Depends(allowed(Action.AUDIT_READ))]
AuditVerifier = Annotated[Principal, Depends(allowed(Action.AUDIT_VERIFY))]
ReportReader = Annotated[Principal, Depends(allowed(Action.REPORT_READ))]
AlertReader = Annotated[Principal, Depends(allowed(Action.ALERT_READ))]
HistoryReader = Annotated[Principal, Depends(allowed(Action.HISTORY_READ))]
ServiceReader = Annotated[Principal, Depends(on_service(Action.JOB_READ))]
ServiceDeleter = Annotated[Principal, Depends(on_service(Action.JOB_CANCEL))]


def queue_owned(queue: Queue) -> Owned:
    """What authorisation looks at in a queue: its tenant and submitters."""
    submitters = queue.spec.submitters
    return Owned(
        kind="queue",
        name=queue.name,
        tenant=queue.tenant,
        submitters=tuple(submitters) if submitters is not None else None,
    )


def may_submit(who: Principal) -> Callable[[Queue], None]:
    """The check the service runs on each submitted job's queue."""

    def check(queue: Queue) -> None:
        require(who, Action.JOB_SUBMIT, queue_owned(queue))

    return check


IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description=(
            "Makes a retried submission safe: the same user repeating the key with the "
            "same request gets the jobs the first one made (for 24 h)"
        ),
        pattern=r"^[\x21-\x7e]{1,255}$",
    ),
]


# The submissions are coroutines that hand the service's work (it blocks on the store)
# to a worker thread themselves: a plain function would cost a second hand-off, for
# FastAPI checks a plain function's answer against the response model in a worker too.


@router.post("/jobs", status_code=201, response_model=schemas.JobOut)
async def submit_job(
    body: schemas.SubmitRequest,
    svc: Service,
    who: CurrentPrincipal,
    idempotency_key: IdempotencyKeyHeader = None,
) -> schemas.JobOut:
    return await run_in_threadpool(
        svc.submit,
        spec_text=body.spec,
        user=who.user,
        may_submit=may_submit(who),
        idempotency_key=idempotency_key,
    )


@router.post("/jobs:batch", status_code=201, response_model=schemas.JobList)
async def submit_jobs(
    body: schemas.SubmitManyRequest,
    svc: Service,
    who: CurrentPrincipal,
    idempotency_key: IdempotencyKeyHeader = None,
) -> schemas.JobList:
    jobs = await run_in_threadpool(
        svc.submit_many,
        spec_texts=body.specs,
        user=who.user,
        may_submit=may_submit(who),
        idempotency_key=idempotency_key,
    )
    return schemas.JobList(jobs=jobs)


@router.post("/services", status_code=201, response_model=ServiceOut)
def apply_service(
    body: schemas.SubmitRequest,
    book: ServiceBook,
    who: CurrentPrincipal,
    request: Request,
    response: Response,
) -> ServiceOut:
    """Create a service from a ``type: service`` file, or update the one of that name
    in its tenant (200): its replicas roll over to the new spec."""
    out, created = book.apply(spec_text=body.spec, user=who.user, may_submit=may_submit(who))
    if not created:
        response.status_code = 200
    return _with_url(out, request)


@router.get("/services", response_model=ServiceList)
def list_services(book: ServiceBook, who: JobLister, request: Request) -> ServiceList:
    found = book.list(tenant=visible_tenant(who))
    return ServiceList(services=[_with_url(s, request) for s in found.services])


@router.get("/services/{tenant}/{name}", response_model=ServiceOut)
def get_service(
    tenant: str, name: str, book: ServiceBook, _: ServiceReader, request: Request
) -> ServiceOut:
    return _with_url(book.get(tenant=tenant, name=name), request)


@router.delete("/services/{tenant}/{name}", response_model=ServiceOut)
def delete_service(tenant: str, name: str, book: ServiceBook, who: ServiceDeleter) -> ServiceOut:
    """Stop every replica of the service and forget it."""
    return book.delete(tenant=tenant, name=name, user=who.user)


def _with_url(service: ServiceOut, request: Request) -> ServiceOut:
    base = str(request.base_url).rstrip("/")
    return service.model_copy(update={"url": base + service.path})


@router.get("/jobs", response_model=schemas.JobPage)
def list_jobs(
    svc: Service,
    who: JobLister,
    queue: str | None = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: str | None = None,
) -> schemas.JobPage:
    return svc.list(queue=queue, states=state, limit=limit, after=after, tenant=visible_tenant(who))


@router.get("/jobs/{job_id}", response_model=schemas.JobOut)
def get_job(job_id: str, svc: Service, _: Reader) -> schemas.JobOut:
    return svc.get(job_id=job_id)


@router.post("/jobs/{job_id}/cancel", response_model=schemas.JobOut)
def cancel_job(job_id: str, svc: Service, who: Canceller) -> schemas.JobOut:
    return svc.cancel(job_id=job_id, user=who.user)


@router.get("/jobs/{job_id}/events", response_model=schemas.EventList)
def job_events(job_id: str, svc: Service, _: Reader) -> schemas.EventList:
    return svc.events(job_id=job_id)


@router.get("/jobs/{job_id}/why", response_model=schemas.WhyOut)
def why(job_id: str, svc: Service, who: Reader) -> schemas.WhyOut:
    return svc.why(job_id=job_id, tenant=visible_tenant(who))


@router.get("/jobs/{job_id}/logs", response_model=schemas.LogChunk)
def logs(
    job_id: str,
    svc: Service,
    _: Reader,
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
def queues(svc: Service, who: QueueReader) -> schemas.QueueUsageTree:
    return svc.queues(tenant=visible_tenant(who))


@router.get("/pools", response_model=schemas.PoolList)
def pools(svc: Service, _: FleetReader) -> schemas.PoolList:
    return svc.pools()


@router.get("/nodes", response_model=schemas.NodeList)
def nodes(svc: Service, who: FleetReader) -> schemas.NodeList:
    return svc.nodes(tenant=visible_tenant(who))


@router.get("/images", response_model=schemas.ImagesOut)
def images(request: Request, svc: Service, who: FleetReader) -> schemas.ImagesOut:
    """The container images on each node (a tenant's principal: only those its tenant
    may run) and what the runtime enforces."""
    return images_view(
        svc.cluster,
        tenant=visible_tenant(who),
        images=request.app.state.images,
        enforcement=request.app.state.enforcement,
    )


@router.get("/cluster", response_model=schemas.ClusterText)
def cluster(svc: Service, _: ClusterReader) -> schemas.ClusterText:
    return svc.cluster_text()


@router.put("/cluster", response_model=schemas.ClusterApplied)
def apply_cluster(
    body: Annotated[schemas.ClusterApply, Body()],
    request: Request,
    svc: Service,
    who: ClusterApplier,
) -> schemas.ClusterApplied:
    hook: Callable[[Cluster], None] | None = getattr(request.app.state, "on_cluster_change", None)
    return svc.apply_cluster(text=body.text, dry_run=body.dry_run, user=who.user, on_change=hook)


@router.post("/tokens", status_code=201, response_model=schemas.TokenIssued)
def create_token(
    body: schemas.TokenCreate, tokens: Tokens, who: CurrentPrincipal
) -> schemas.TokenIssued:
    return tokens.issue(who, body)


@router.get("/tokens", response_model=schemas.TokenList)
def list_tokens(tokens: Tokens, who: CurrentPrincipal) -> schemas.TokenList:
    return tokens.list(who)


@router.delete("/tokens/{token_id}", response_model=schemas.TokenOut)
def revoke_token(token_id: str, tokens: Tokens, who: CurrentPrincipal) -> schemas.TokenOut:
    return tokens.revoke(who, token_id)


@router.get("/audit", response_model=schemas.AuditPage)
def audit_records(
    svc: Service,
    who: AuditReader,
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
    return audit.list_audit(
        svc.sessions,
        visible_tenant=visible_tenant(who),
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
def audit_verify(svc: Service, who: AuditVerifier) -> schemas.AuditVerifyOut:
    """Check the audit chain; name the first edited, deleted or reordered record."""
    return audit.verify_audit(svc.sessions)


@router.get("/report", response_model=schemas.ReportOut)
def report(
    svc: Service,
    who: ReportReader,
    since: Annotated[str, Query(min_length=1, max_length=64)] = "7d",
    until: Annotated[str | None, Query(max_length=64)] = None,
    by: Literal["tenant", "queue", "pool", "user", "type"] = "tenant",
    jobs: bool = False,
) -> schemas.ReportOut:
    """Usage, waste and cost per group, waits, failures, preemptions and reclaims over
    ``since`` (a duration before ``until``, or a time) to ``until`` (a time; default
    now); ``jobs=true`` adds one record per attempt. A tenant's principal sees only its
    tenant's jobs."""
    return reports.usage_report(
        svc.sessions,
        svc.cluster,
        since=since,
        until=until,
        by=by,
        tenant=visible_tenant(who),
        records=jobs,
        now=svc.clock(),
    )


@router.get("/whatif", response_model=dict[str, Any])
def whatif_in_force(
    svc: Service,
    who: HistoryReader,
    since: Annotated[str, Query(min_length=1, max_length=64)] = "7d",
    until: Annotated[str | None, Query(max_length=64)] = None,
    policy: Annotated[str | None, Query(max_length=128)] = None,
    series: bool = False,
) -> dict[str, Any]:
    """Replay the jobs recorded from ``since`` to ``until`` under the configuration in
    force at the time, next to what really happened: the replay's fidelity."""
    return whatif.whatif(
        svc, who, text=None, since=since, until=until, policy=policy, series=series
    )


@router.post("/whatif", response_model=dict[str, Any])
def whatif_proposed(
    svc: Service, who: HistoryReader, body: schemas.WhatifRequest
) -> dict[str, Any]:
    """Replay the recorded jobs under the configuration in force and under the proposed
    ``cluster.yaml``, side by side with what really happened; nothing is applied."""
    return whatif.whatif(
        svc,
        who,
        text=body.text,
        since=body.since,
        until=body.until,
        policy=body.policy,
        series=body.series,
    )


class CsvResponse(PlainTextResponse):
    media_type = "text/csv"


@router.get(
    "/history/export",
    response_class=Response,
    responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}}},
)
def history_export(
    svc: Service,
    who: HistoryReader,
    since: Annotated[str, Query(min_length=1, max_length=64)] = "7d",
    until: Annotated[str | None, Query(max_length=64)] = None,
    users: bool = False,
) -> CsvResponse:
    """The recorded jobs as a generic trace CSV, without names, commands or users (with
    ``users``, pseudonyms ``u1, u2, ...`` that tell whose jobs are the same person's; see
    ``allot history export``); ``X-Left-Out`` counts the jobs that never completed a run."""
    text, left_out = whatif.history_export(svc, who, since=since, until=until, users=users)
    return CsvResponse(text, headers={"X-Left-Out": str(left_out)})


@router.get("/alerts", response_model=schemas.AlertPage)
def alerts(
    svc: Service,
    who: AlertReader,
    kind: Annotated[str | None, Query(max_length=32)] = None,
    job: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
) -> schemas.AlertPage:
    """Alerts by id (``max_wait``, …) with their webhook delivery; a tenant's principal
    sees only its tenant's."""
    return alerts_page(
        svc.sessions,
        tenant=visible_tenant(who),
        kind=kind,
        job=job,
        since=since,
        after=after,
        limit=limit,
    )


@open_router.get("/healthz", response_model=schemas.Health)
def healthz() -> schemas.Health:
    return schemas.Health(status="ok")
