"""The dashboard route: one server-rendered page at ``/`` (see :mod:`allotment.web`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from allotment.api.access import CurrentPrincipal, principal
from allotment.api.gate import TOKEN_COOKIE
from allotment.api.policy import visible_tenant
from allotment.api.service import JobService, job_out
from allotment.domain.lifecycle import JobState
from allotment.store.jobs import list_jobs, recent_jobs
from allotment.web.render import dashboard_page

router = APIRouter(include_in_schema=False, dependencies=[Depends(principal)])

ACTIVE = (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING)
WAITING = (JobState.SUBMITTED, JobState.PENDING)
ENDED = (
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.PREEMPTED,
    JobState.CANCELLED,
    JobState.RECLAIMED,
)
SHOWN = 200
"""At most this many jobs per section."""


@router.get("/", response_class=HTMLResponse)
def dashboard(request: Request, who: CurrentPrincipal, token: str | None = None) -> Response:
    """The page, showing only what ``who`` may see (its tenant's jobs and queues)."""
    if token is not None:
        # Authentication accepted it: keep it in a cookie and drop it from the address bar.
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
        return response
    svc = request.app.state.service
    assert isinstance(svc, JobService)
    tenant = visible_tenant(who)
    with svc.sessions() as db:
        active = [
            job_out(j).model_dump()
            for j in list_jobs(db, tenant=tenant, states=ACTIVE, limit=SHOWN)
        ]
        waiting = [
            job_out(j).model_dump()
            for j in list_jobs(db, tenant=tenant, states=WAITING, limit=SHOWN)
        ]
        ended = [
            job_out(j).model_dump() for j in recent_jobs(db, tenant=tenant, states=ENDED, limit=20)
        ]
    queues = [q.model_dump() for q in svc.queues(tenant=tenant).queues]
    page = dashboard_page(
        active=active, waiting=waiting, finished=ended, queues=queues, now=svc.clock()
    )
    return HTMLResponse(page)
