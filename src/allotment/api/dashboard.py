"""The dashboard: server-rendered pages (:mod:`allotment.web.pages`) with live parts.

- ``/`` — the overview: GPUs by pool, the queue tree with quota bars (nominal, used,
  borrowed), running, waiting (with their reasons) and recently ended jobs;
- ``/ui/jobs/<id>`` — one job: state, the ``why`` answer, its timeline from the events,
  the tail of one replica's output or errors (``?replica=worker-1&stream=err``; the
  first replica's output by default) with a link per replica and stream, its spec, and
  a cancel button for those who may cancel it;
- ``/ui/queues/<name>`` — one queue: its quota and use per pool, whose unused quota it
  borrows and who borrows its own (GPUs per pool; :mod:`allotment.api.queue_view`), its
  waiting jobs in the order it would admit them with reason, position and estimated
  start, and its running jobs with how long they have run and what they borrow. The
  line and the loans are computed once per change for all viewers;
- ``/ui/reports`` — usage, cost, idle waste, waits, failures, preemptions and reclaims
  over a window, with charts (the same figures, tables and charts as ``allot report``),
  and ``/ui/reports.csv`` to download its usage rows;
- ``/ui/admin`` — for platform and tenant admins: tokens (with a revoke button), the
  audit trail with filters and the state of its hash chain, alerts with their webhook
  deliveries;
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
from collections.abc import Sequence
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup
from sqlalchemy import func, select

from allotment.accounting.report import parse_window
from allotment.api import audit, explain, reports
from allotment.api.access import CurrentPrincipal, principal
from allotment.api.alerts import alerts_page
from allotment.api.auth import Principal
from allotment.api.errors import status_for
from allotment.api.gate import TOKEN_COOKIE
from allotment.api.policy import Action, Owned, may, require, visible_tenant
from allotment.api.queue_view import page_loans
from allotment.api.service import JobService, job_out
from allotment.domain.cluster import Cluster
from allotment.domain.errors import AllotmentError, InvalidInput, NotFound
from allotment.domain.lifecycle import TERMINAL, JobState
from allotment.domain.resources import GPU, MILLI
from allotment.scheduler.lending import Loan
from allotment.store.allocations import placements_from_json
from allotment.store.jobs import jobs_in_groups, recent_jobs
from allotment.store.models import Alert, Attempt, DeviceUsage
from allotment.store.usage import job_usage_rows
from allotment.store.views import open_attempts
from allotment.web.pages import render
from allotment.web.report import csv_text, title
from allotment.web.report_html import report_body

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
LOG_TAIL = 4096
"""Bytes of output (the last) shown on a job's page."""
USAGE_POINTS = 720
"""Most points of a utilisation chart."""
UTILISATION_WINDOW_S = 6 * 3600
"""The overview's utilisation chart spans this much."""
FRESH_S = 600.0
"""A GPU's newest telemetry counts for the overview when no older than this."""
BUSY_PCT = 5.0
"""A GPU at or above this utilisation counts as in use."""
ALERTS_SHOWN = 5


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


def _add_lent(rows: list[dict[str, Any]], loans: Sequence[Loan], cluster: Cluster) -> None:
    """Set each row's ``lent``: GPUs of the queue's subtree's unused quota in its pool
    that queues outside it use now."""
    for row in rows:
        name = row["queue"]["name"]
        inside = {q.name for q in cluster.queues.values() if name in q.path}
        milli = sum(
            loan.amount
            for loan in loans
            if loan.pool == row["pool"] and loan.lender in inside and loan.borrower not in inside
        )
        row["lent"] = round(milli / MILLI, 2)


def _overview(svc: JobService, who: Principal) -> dict[str, Any]:
    tenant = visible_tenant(who)
    with svc.sessions() as db:
        # One read for both: a job admitted meanwhile is in one list, never in neither.
        active, waiting = (
            [job_out(j).model_dump() for j in rows]
            for rows in jobs_in_groups(db, [ACTIVE, WAITING], tenant=tenant, limit=SHOWN)
        )
        ended = recent_jobs(db, tenant=tenant, states=ENDED, limit=20)
        finished = [job_out(j).model_dump() for j in ended]
    queues = _tree(svc, tenant)
    rows = _queue_rows(queues)
    _add_lent(rows, svc.fleet_loans(), svc.cluster)
    return {
        "who": who,
        "now": svc.clock(),
        "pools": [p.model_dump() for p in svc.pools().pools],
        "queue_rows": rows,
        "active": active,
        "waiting": waiting,
        "finished": finished,
        "utilisation": _utilisation(svc),
        "busy": _busy_by_pool(svc),
        "alerts": _recent_alerts(svc, tenant),
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


LogStream = Literal["out", "err"]
ReplicaQuery = Annotated[str | None, Query(max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]
MAX_REPLICA_LINKS = 64


def _replicas(spec: dict[str, Any]) -> list[str]:
    """The job's replica names (``worker-0``, ...), the first :data:`MAX_REPLICA_LINKS`."""
    names: list[str] = []
    for group in spec.get("replicas") or []:
        for index in range(int(group.get("count", 1))):
            if len(names) == MAX_REPLICA_LINKS:
                return names
            names.append(f"{group.get('name', 'worker')}-{index}")
    return names


def _job(
    svc: JobService,
    who: Principal,
    job_id: str,
    replica: str | None = None,
    stream: LogStream = "out",
) -> dict[str, Any]:
    """What a job's page shows, with the tail of ``replica``'s ``stream`` (default: the
    first replica's output); raises ``NotFound`` for another tenant's job."""
    owned = svc.owned(job_id=job_id)
    require(who, Action.JOB_READ, owned)
    job = svc.get(job_id=job_id).model_dump()
    why = None
    if job["state"] in (s.value for s in WAITING + ACTIVE):
        why = svc.why(job_id=job_id, tenant=visible_tenant(who)).model_dump()
    try:
        chunk = svc.logs(
            job_id=job_id,
            attempt=None,
            replica=replica,
            stream=stream,
            offset=LOG_TAIL,
            limit=LOG_TAIL,
            from_end=True,
        )
        tail, shown = chunk.data, chunk.replica
    except AllotmentError:  # no such replica (yet): nothing to show
        tail, shown = "", replica
    usage, cost = _job_usage(svc, job_id, job["attempt"])
    return {
        "who": who,
        "job": job,
        "usage": usage,
        "cost": cost,
        "why": why,
        "events": [e.model_dump() for e in svc.events(job_id=job_id).events],
        "log_tail": tail,
        "log_replica": shown,
        "log_stream": stream,
        "replicas": _replicas(job["spec"]),
        "live_query": urlencode({k: v for k, v in (("replica", replica), ("stream", stream)) if v}),
        "can_cancel": JobState(job["state"]) not in TERMINAL and may(who, Action.JOB_CANCEL, owned),
        "spec_text": json.dumps(job["spec"], indent=2),
    }


def _job_usage(
    svc: JobService, job_id: str, attempt_no: int
) -> tuple[list[tuple[float, float]], dict[str, Any] | None]:
    """The attempt's GPU utilisation over time (mean of its GPUs per interval, from
    telemetry) and its cost so far: GPUs held x hours x the pool's price per GPU-hour."""
    if attempt_no == 0:
        return [], None
    with svc.sessions() as db:
        attempt = db.get(Attempt, (job_id, attempt_no))
        if attempt is None:
            return [], None
        rows = job_usage_rows(db, [(job_id, attempt_no)], since=0.0)[(job_id, attempt_no)]
        points = [
            (r.interval_start + r.interval_s, float(r.gpu_util_avg))
            for r in rows[-USAGE_POINTS:]
            if r.gpu_util_avg is not None
        ]
        gpus = sum(
            explain.natural(p.resources.get(GPU, 0))
            for p in placements_from_json(attempt.allocation)
        )
        start = attempt.start_time
        end = attempt.end_time if attempt.end_time is not None else svc.clock()
    pool = svc.cluster.pools.get(attempt.pool or "")
    price = pool.price_per_gpu_hour if pool is not None else 0.0
    hours = max(0.0, end - start) / 3600 if start is not None else 0.0
    cost = {"gpus": gpus, "hours": hours, "price": price, "cost": gpus * hours * price}
    return points, cost


def _utilisation(svc: JobService) -> list[tuple[float, float]]:
    """The fleet's mean GPU utilisation per sampled interval over the last
    :data:`UTILISATION_WINDOW_S` (from telemetry)."""
    since = svc.clock() - UTILISATION_WINDOW_S
    with svc.sessions() as db:
        rows = db.execute(
            select(DeviceUsage.interval_start, func.avg(DeviceUsage.util_avg))
            .where(DeviceUsage.interval_start >= since, DeviceUsage.util_avg.is_not(None))
            .group_by(DeviceUsage.interval_start)
            .order_by(DeviceUsage.interval_start.desc())
            .limit(USAGE_POINTS)
        ).all()
    return [(float(at), float(util)) for at, util in reversed(rows)]


def _busy_by_pool(svc: JobService) -> dict[str, dict[str, int]]:
    """Per pool, from each GPU's newest telemetry interval of the last
    :data:`FRESH_S`: how many GPUs were measured and how many of them were busy
    (utilisation at least :data:`BUSY_PCT`)."""
    since = svc.clock() - FRESH_S
    newest = (
        select(
            DeviceUsage.node,
            DeviceUsage.device,
            func.max(DeviceUsage.interval_start).label("start"),
        )
        .where(DeviceUsage.interval_start >= since)
        .group_by(DeviceUsage.node, DeviceUsage.device)
        .subquery()
    )
    query = select(DeviceUsage.node, DeviceUsage.util_max).join(
        newest,
        (DeviceUsage.node == newest.c.node)
        & (DeviceUsage.device == newest.c.device)
        & (DeviceUsage.interval_start == newest.c.start),
    )
    nodes = svc.cluster.nodes
    out: dict[str, dict[str, int]] = {}
    with svc.sessions() as db:
        for node, util in db.execute(query):
            found = nodes.get(node)
            if found is None or util is None:
                continue
            figures = out.setdefault(found.pool, {"measured": 0, "busy": 0})
            figures["measured"] += 1
            figures["busy"] += int(util >= BUSY_PCT)
    return out


def _recent_alerts(svc: JobService, tenant: str | None) -> list[dict[str, Any]]:
    """The newest :data:`ALERTS_SHOWN` alerts ``tenant`` may see (all for ``None``)."""
    query = select(Alert).order_by(Alert.id.desc()).limit(ALERTS_SHOWN)
    if tenant is not None:
        query = query.where(Alert.tenant == tenant)
    with svc.sessions() as db:
        return [
            {"id": a.id, "at": a.at, "kind": a.kind, "job": a.job_id, "message": a.message}
            for a in db.scalars(query)
        ]


def _queue(svc: JobService, who: Principal, name: str) -> dict[str, Any]:
    """What a queue's page shows; raises ``NotFound`` for another tenant's queue."""
    queue = svc.cluster.queues.get(name)
    if queue is None:
        raise NotFound("queue", name)
    require(who, Action.QUEUE_READ, Owned(kind="queue", name=name, tenant=queue.tenant))
    tenant = visible_tenant(who)
    usage = [r for r in _queue_rows(_tree(svc, tenant)) if r["queue"]["name"] == name]
    line = svc.queue_line(name)  # shared by every viewer, as the loans: scoped below
    loans = page_loans(svc.fleet_loans(), svc.cluster, name, tenant)
    with svc.sessions() as db:
        running = []
        for job, attempt in open_attempts(db):
            if job.queue == name:
                start = attempt.start_time or job.updated_at
                borrowed = {k: explain.natural(int(v)) for k, v in (attempt.borrowed or {}).items()}
                running.append(
                    {
                        **job_out(job).model_dump(),
                        "ran_s": svc.clock() - start,
                        "borrowed": borrowed,
                        "pool": attempt.pool,
                    }
                )
    return {
        "who": who,
        "queue": queue,
        "usage": usage,
        "line": line,
        "borrows": loans.borrows,
        "lends": loans.lends,
        "split": loans.split,
        "running": running,
        "now": svc.clock(),
    }


def _tree(svc: JobService, tenant: str | None) -> list[dict[str, Any]]:
    return [q.model_dump() for q in svc.queues(tenant=tenant).queues]


@router.get("/ui/queues/{name}", response_class=HTMLResponse)
def queue_page(request: Request, name: str, who: CurrentPrincipal) -> HTMLResponse:
    return HTMLResponse(render("queue.html", **_queue(_service(request), who, name)))


@router.get("/ui/fragments/queues/{name}", response_class=HTMLResponse)
def queue_live(request: Request, name: str, who: CurrentPrincipal) -> HTMLResponse:
    return HTMLResponse(render("queue_live.html", **_queue(_service(request), who, name)))


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    request: Request,
    job_id: str,
    who: CurrentPrincipal,
    replica: ReplicaQuery = None,
    stream: LogStream = "out",
) -> HTMLResponse:
    """The job's page; ``replica`` and ``stream`` choose the log shown (a shareable link)."""
    data = _job(_service(request), who, job_id, replica, stream)
    return HTMLResponse(render("job.html", **data))


@router.get("/ui/fragments/jobs/{job_id}", response_class=HTMLResponse)
def job_live(
    request: Request,
    job_id: str,
    who: CurrentPrincipal,
    replica: ReplicaQuery = None,
    stream: LogStream = "out",
) -> HTMLResponse:
    data = _job(_service(request), who, job_id, replica, stream)
    return HTMLResponse(render("job_live.html", **data))


@router.post("/ui/jobs/{job_id}/cancel", response_class=HTMLResponse)
def cancel(request: Request, job_id: str, who: CurrentPrincipal) -> HTMLResponse:
    """Cancel the job (as ``POST /api/v1/jobs/{id}/cancel`` does); answer its live part."""
    svc = _service(request)
    require(who, Action.JOB_CANCEL, svc.owned(job_id=job_id))
    svc.cancel(job_id=job_id, user=who.user)
    return HTMLResponse(render("job_live.html", **_job(svc, who, job_id)))


Grouping = Literal["tenant", "queue", "pool", "user", "type"]
Since = Annotated[str, Query(min_length=1, max_length=64)]
Until = Annotated[str | None, Query(max_length=64)]


def _report(svc: JobService, who: Principal, since: str, until: str | None, by: str) -> Any:
    require(who, Action.REPORT_READ)
    return reports.usage_report(
        svc.sessions,
        svc.cluster,
        since=since,
        until=until or None,
        by=by,
        tenant=visible_tenant(who),
        records=False,
        now=svc.clock(),
    ).model_dump()


@router.get("/ui/reports", response_class=HTMLResponse)
def reports_page(
    request: Request,
    who: CurrentPrincipal,
    since: Since = "7d",
    until: Until = None,
    by: Grouping = "tenant",
) -> HTMLResponse:
    """The report over ``since``..``until`` grouped ``by``; a window that cannot be read
    is said on the page (422)."""
    svc = _service(request)
    context: dict[str, Any] = {"who": who, "since": since, "until": until, "by": by}
    context["query"] = urlencode({k: v for k, v in context.items() if k != "who" and v})
    try:
        data = _report(svc, who, since, until, by)
    except InvalidInput as exc:  # a window that cannot be read: say so on the page
        page = render("reports.html", **context, heading=exc.message, body="")
        return HTMLResponse(page, status_code=status_for(exc))
    body = Markup(report_body(data))
    return HTMLResponse(render("reports.html", **context, heading=title(data), body=body))


@router.get("/ui/reports.csv")
def reports_csv(
    request: Request,
    who: CurrentPrincipal,
    since: Since = "7d",
    until: Until = None,
    by: Grouping = "tenant",
) -> Response:
    """The usage rows of the same report as CSV (what ``allot report --format csv``
    writes), as a download."""
    data = _report(_service(request), who, since, until, by)
    return Response(
        csv_text(data),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="allotment-report-by-{by}.csv"'},
    )


AUDIT_SHOWN = 200


@router.get("/ui/admin", response_class=HTMLResponse)
def admin_page(
    request: Request,
    who: CurrentPrincipal,
    since: Since = "24h",
    user: Annotated[str | None, Query(max_length=128)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    object: Annotated[str | None, Query(max_length=512)] = None,
) -> HTMLResponse:
    """Tokens, the audit trail (filtered; its chain checked, for a platform admin) and
    alerts with their deliveries, for platform and tenant admins: a tenant admin sees
    its tenant's only."""
    require(who, Action.TOKEN_READ)
    svc = _service(request)
    tenant = visible_tenant(who)
    filters = {"since": since, "user": user, "action": action, "object": object}
    problem = None
    try:
        start = parse_window(since, None, now=svc.clock()).since
    except InvalidInput as exc:
        problem, start = exc.message, None
    records = audit.list_audit(
        svc.sessions,
        visible_tenant=tenant,
        user=user or None,
        tenant=None,
        action=action or None,
        object=object or None,
        since=start,
        until=None,
        after=None,
        limit=AUDIT_SHOWN,
    ).records
    verified = audit.verify_audit(svc.sessions) if may(who, Action.AUDIT_VERIFY) else None
    page = render(
        "admin.html",
        who=who,
        filters=filters,
        problem=problem,
        tokens=request.app.state.tokens.list(who).tokens,
        records=records,
        shown=AUDIT_SHOWN,
        verified=verified,
        alerts=alerts_page(
            svc.sessions, tenant=tenant, kind=None, job=None, since=None, after=None, limit=50
        ).alerts,
    )
    return HTMLResponse(page, status_code=422 if problem else 200)


@router.post("/ui/admin/tokens/{token_id}/revoke", response_class=HTMLResponse)
def revoke_token(request: Request, token_id: str, who: CurrentPrincipal) -> HTMLResponse:
    """Revoke a token (as ``DELETE /api/v1/tokens/{id}`` does); answer its new row."""
    token = request.app.state.tokens.revoke(who, token_id)
    return HTMLResponse(render("token_row.html", token=token))
