"""The dashboard route: one server-rendered page at ``/`` (see :mod:`allotment.web`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from allotment.api.gate import TOKEN_COOKIE
from allotment.api.service import JobService, job_out
from allotment.domain.lifecycle import JobState
from allotment.store.jobs import list_jobs, recent_jobs
from allotment.web.render import dashboard_page

router = APIRouter(include_in_schema=False)

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
def dashboard(request: Request, token: str | None = None) -> Response:
    if token is not None:
        # The gate accepted it: keep it in a cookie and drop it from the address bar.
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
        return response
    svc = request.app.state.service
    assert isinstance(svc, JobService)
    with svc.sessions() as db:
        active = [job_out(j).model_dump() for j in list_jobs(db, states=ACTIVE, limit=SHOWN)]
        waiting = [job_out(j).model_dump() for j in list_jobs(db, states=WAITING, limit=SHOWN)]
        ended = [job_out(j).model_dump() for j in recent_jobs(db, states=ENDED, limit=20)]
    queues = [q.model_dump() for q in svc.queues().queues]
    page = dashboard_page(
        active=active, waiting=waiting, finished=ended, queues=queues, now=svc.clock()
    )
    return HTMLResponse(page)
