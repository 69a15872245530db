"""The dashboard: server-rendered pages (:mod:`allotment.web.pages`) with live parts.

- ``/`` — the overview: GPUs by pool, the queue tree with quota bars (nominal, used,
  borrowed), running, waiting (with their reasons) and recently ended jobs;
- ``/ui/jobs/<id>`` — one job: state, the ``why`` answer, its timeline from the events,
  the tail of its first replica's output, its spec, and a cancel button for those who
  may cancel it;
- ``/ui/fragments/...`` — the live parts of those pages, which htmx reloads every two
  seconds; ``POST /ui/jobs/<id>/cancel`` cancels and answers the job's live part.

Every page and fragment shows only what the signed-in principal may see, with the
API's own rules (another tenant's job is a 404). Sign in with ``/?token=…`` once: the
token is kept in an HttpOnly, SameSite=Strict cookie. The cookie reads; it writes (the
cancel button) only with htmx's ``HX-Request`` header, which a page of another site
cannot send without this server's consent (:func:`allotment.api.gate.presented_token`).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from allotment.api.access import CurrentPrincipal, principal
from allotment.api.auth import Principal
from allotment.api.gate import TOKEN_COOKIE
from allotment.api.policy import Action, may, require, visible_tenant
from allotment.api.service import JobService, job_out
from allotment.domain.errors import AllotmentError
from allotment.domain.lifecycle import TERMINAL, JobState
from allotment.store.jobs import list_jobs, recent_jobs
from allotment.web.pages import render

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
LOG_TAIL = 4000
"""Characters of output shown on a job's page."""


def _service(request: Request) -> JobService:
    svc = request.app.state.service
    assert isinstance(svc, JobService)
    return svc


def _queue_rows(queues: list[dict[str, Any]], depth: int = 0) -> list[dict[str, Any]]:
    """One row per queue and pool of its usage (one without a pool when it has none)."""
    rows: list[dict[str, Any]] = []
    for queue in queues:
        usage = queue.get("usage") or {"": {"nominal": 0, "used": 0, "borrowed": 0}}
        for pool, figures in usage.items():
            rows.append({"queue": queue, "pool": pool, "usage": figures, "depth": depth})
        rows.extend(_queue_rows(queue.get("children", []), depth + 1))
    return rows


def _overview(svc: JobService, who: Principal) -> dict[str, Any]:
    tenant = visible_tenant(who)
    with svc.sessions() as db:

        def jobs(states: tuple[JobState, ...]) -> list[dict[str, Any]]:
            rows = list_jobs(db, tenant=tenant, states=states, limit=SHOWN)
            return [job_out(j).model_dump() for j in rows]

        active, waiting = jobs(ACTIVE), jobs(WAITING)
        ended = recent_jobs(db, tenant=tenant, states=ENDED, limit=20)
        finished = [job_out(j).model_dump() for j in ended]
    queues = [q.model_dump() for q in svc.queues(tenant=tenant).queues]
    return {
        "who": who,
        "now": svc.clock(),
        "pools": [p.model_dump() for p in svc.pools().pools],
        "queue_rows": _queue_rows(queues),
        "active": active,
        "waiting": waiting,
        "finished": finished,
    }


@router.get("/", response_class=HTMLResponse)
def dashboard(request: Request, who: CurrentPrincipal, token: str | None = None) -> Response:
    """The overview, showing only what ``who`` may see (its tenant's jobs and queues)."""
    if token is not None:
        # Authentication accepted it: keep it in a cookie and drop it from the address bar.
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
        return response
    return HTMLResponse(render("overview.html", **_overview(_service(request), who)))


@router.get("/ui/fragments/overview", response_class=HTMLResponse)
def overview_live(request: Request, who: CurrentPrincipal) -> HTMLResponse:
    return HTMLResponse(render("overview_live.html", **_overview(_service(request), who)))


def _job(svc: JobService, who: Principal, job_id: str) -> dict[str, Any]:
    """What a job's page shows; raises ``NotFound`` for another tenant's job."""
    owned = svc.owned(job_id=job_id)
    require(who, Action.JOB_READ, owned)
    job = svc.get(job_id=job_id).model_dump()
    why = None
    if job["state"] in (s.value for s in WAITING + ACTIVE):
        why = svc.why(job_id=job_id, tenant=visible_tenant(who)).model_dump()
    try:
        chunk = svc.logs(
            job_id=job_id, attempt=None, replica=None, stream="out", offset=0, limit=1 << 20
        )
        tail, replica = chunk.data[-LOG_TAIL:], chunk.replica
    except AllotmentError:  # no such replica (yet): nothing to show
        tail, replica = "", None
    return {
        "who": who,
        "job": job,
        "why": why,
        "events": [e.model_dump() for e in svc.events(job_id=job_id).events],
        "log_tail": tail,
        "log_replica": replica,
        "can_cancel": JobState(job["state"]) not in TERMINAL and may(who, Action.JOB_CANCEL, owned),
        "spec_text": json.dumps(job["spec"], indent=2),
    }


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, who: CurrentPrincipal) -> HTMLResponse:
    return HTMLResponse(render("job.html", **_job(_service(request), who, job_id)))


@router.get("/ui/fragments/jobs/{job_id}", response_class=HTMLResponse)
def job_live(request: Request, job_id: str, who: CurrentPrincipal) -> HTMLResponse:
    return HTMLResponse(render("job_live.html", **_job(_service(request), who, job_id)))


@router.post("/ui/jobs/{job_id}/cancel", response_class=HTMLResponse)
def cancel(request: Request, job_id: str, who: CurrentPrincipal) -> HTMLResponse:
    """Cancel the job (as ``POST /api/v1/jobs/{id}/cancel`` does); answer its live part."""
    svc = _service(request)
    require(who, Action.JOB_CANCEL, svc.owned(job_id=job_id))
    svc.cancel(job_id=job_id, user=who.user)
    return HTMLResponse(render("job_live.html", **_job(svc, who, job_id)))
