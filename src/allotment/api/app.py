"""The composition root of the HTTP API."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.audit import AuditTrail
from allotment.api.auth import Authenticator, forget_tokens
from allotment.api.dashboard import router as dashboard_router
from allotment.api.errors import install_error_handlers
from allotment.api.gate import AfterWrite
from allotment.api.images import EnforcementSource, ImagesSource
from allotment.api.limits import MAX_BODY_BYTES, BodyLimit, RefuseNul
from allotment.api.metrics import DEFAULT_SETTLE_S, metrics_registry
from allotment.api.metrics import router as metrics_router
from allotment.api.proxy import Upstreams
from allotment.api.proxy import router as proxy_router
from allotment.api.ratelimit import RateLimit, RateLimiter
from allotment.api.routes import open_router, router
from allotment.api.service import JobService
from allotment.api.services import Services
from allotment.api.tokens import TokenService
from allotment.control.cluster_state import ClusterState
from allotment.control.services import ServiceTraffic
from allotment.domain.cluster import Cluster
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.store.batching import GroupCommit
from allotment.web.pages import STATIC


def create_app(
    *,
    cluster: Cluster | ClusterState,
    store_sessions: sessionmaker[Session],
    clock: Callable[[], float] = time.time,
    max_body_bytes: int = MAX_BODY_BYTES,
    authenticator: Authenticator | None = None,
    after_write: Callable[[], None] | None = None,
    work_root: Path | None = None,
    policy: SchedulerPolicy | None = None,
    audit: bool = True,
    rate_limit: RateLimit | None = None,
    metrics_settle_s: float = DEFAULT_SETTLE_S,
    images: ImagesSource | None = None,
    enforcement: EnforcementSource | None = None,
    traffic: ServiceTraffic | None = None,
) -> FastAPI:
    """An app serving ``/api/v1`` and the dashboard for ``cluster`` on the store behind
    ``store_sessions``. ``cluster`` is a fixed cluster, or the server's
    :class:`~allotment.control.cluster_state.ClusterState` (shared with its loop).

    ``authenticator`` (see :mod:`allotment.api.auth`) decides who each request speaks
    for; without one every request is a platform admin named ``anonymous`` (tests,
    embedding). Each request's principal is left in ``request.state.principal``.
    ``after_write`` is called after each successful write (the server wakes the control
    loop). ``work_root`` is the control loop's (where replica logs are, see
    :mod:`allotment.store.layout`); ``policy`` is the loop's scheduler policy, used to
    explain waiting jobs. ``audit`` records every write and sensitive read in the audit
    trail (:mod:`allotment.api.audit`), refusals included. ``rate_limit`` turns on a
    token bucket per API token (:mod:`allotment.api.ratelimit`; off by default). After
    ``PUT /cluster`` the app calls ``app.state.on_cluster_change(cluster)`` when the
    composition has set it. ``GET /metrics`` serves Prometheus metrics read from the
    store (:mod:`allotment.api.metrics`; ``metrics_settle_s`` is its event settling
    time). ``images`` and ``enforcement`` are the executor's
    :meth:`~allotment.executors.base.Executor.images` and
    :meth:`~allotment.executors.base.Executor.enforcement`, for ``GET /images``
    (without them the images are unknown; see :mod:`allotment.api.images`).
    ``traffic`` is where the service proxy (:mod:`allotment.api.proxy`) counts requests
    in flight, read by the server's service controller. Does not start a server or the
    control loop.
    """
    app = FastAPI(title="Allotment", version="1")
    writes = GroupCommit(store_sessions)  # requests' writes, committed in groups
    app.state.service = JobService(
        cluster=cluster,
        sessions=store_sessions,
        clock=clock,
        work_root=work_root,
        policy=policy,
        writes=writes,
    )
    app.state.services = Services(app.state.service)
    app.state.traffic = traffic if traffic is not None else ServiceTraffic()
    app.state.upstreams = Upstreams()
    app.state.tokens = TokenService(
        cluster=lambda: app.state.service.cluster,
        sessions=store_sessions,
        clock=clock,
        on_revoke=lambda: forget_tokens(authenticator),
    )
    app.state.authenticator = authenticator
    app.state.on_cluster_change = None
    app.state.images = images
    app.state.enforcement = enforcement
    app.state.metrics = metrics_registry(
        store_sessions,
        lambda: app.state.service.cluster,
        clock=clock,
        settle_s=metrics_settle_s,
    )
    app.include_router(open_router)
    app.include_router(router)
    app.include_router(dashboard_router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="static")
    app.include_router(proxy_router)
    app.include_router(metrics_router)
    install_error_handlers(app)
    if after_write is not None:
        app.add_middleware(AfterWrite, hook=after_write)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(RefuseNul)
    if audit:
        app.add_middleware(AuditTrail, writes=writes, clock=clock)
    if rate_limit is not None:
        app.add_middleware(RateLimiter, limit=rate_limit)  # outermost: floods are not audited
    return app
