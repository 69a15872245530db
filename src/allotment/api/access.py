"""The request side of authentication and authorisation, as FastAPI dependencies.

:func:`principal` authenticates a request once (bearer token; on the dashboard also
``?token=`` or its cookie) with the app's authenticator and keeps the
:class:`~allotment.api.auth.Principal` in ``request.state.principal`` (user, tenant,
role), where middleware such as an audit log reads it after the response. The routers
depend on it, so every route but the open ones needs a valid token. :func:`allowed` and
:func:`on_job` check one :class:`~allotment.api.policy.Action` through
:func:`~allotment.api.policy.require`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from allotment.api.auth import Authenticator, Principal, authenticate, authenticate_now
from allotment.api.gate import presented_token
from allotment.api.policy import Action, require
from allotment.api.service import JobService
from allotment.api.services import Services
from allotment.api.tokens import TokenService


async def principal(request: Request) -> Principal:
    """Who the request speaks for; raises ``Unauthenticated`` (401) saying why not. On
    the event loop when the authenticator answers without I/O (see
    :func:`~allotment.api.auth.authenticate_now`), else in a worker thread."""
    known = getattr(request.state, "principal", None)
    if isinstance(known, Principal):
        return known
    authenticator: Authenticator | None = getattr(request.app.state, "authenticator", None)
    token = presented_token(request.scope)
    found = authenticate_now(authenticator, token)
    if found is None:
        found = await run_in_threadpool(authenticate, authenticator, token)
    request.state.principal = found
    return found


CurrentPrincipal = Annotated[Principal, Depends(principal)]


async def service(request: Request) -> JobService:
    svc = request.app.state.service
    assert isinstance(svc, JobService)
    return svc


async def token_service(request: Request) -> TokenService:
    svc = request.app.state.tokens
    assert isinstance(svc, TokenService)
    return svc


async def services(request: Request) -> Services:
    found = request.app.state.services
    assert isinstance(found, Services)
    return found


Service = Annotated[JobService, Depends(service)]
ServiceBook = Annotated[Services, Depends(services)]
Tokens = Annotated[TokenService, Depends(token_service)]


def allowed(action: Action) -> Callable[[Principal], Principal]:
    """A dependency: the principal, when it may do ``action`` at all; else 403."""

    def check(who: CurrentPrincipal) -> Principal:
        require(who, action)
        return who

    return check


def on_service(action: Action) -> Callable[[str, str, Principal, Services], Principal]:
    """A dependency for ``/services/{tenant}/{name}`` routes: the principal, when it may
    do ``action`` on that service; 404 for another tenant's, else 403."""

    def check(tenant: str, name: str, who: CurrentPrincipal, book: ServiceBook) -> Principal:
        require(who, action, book.owned(tenant=tenant, name=name))
        return who

    return check


def on_job(action: Action) -> Callable[[str, Principal, JobService], Principal]:
    """A dependency for ``/jobs/{job_id}`` routes: the principal, when it may do
    ``action`` on that job; 404 for a job of another tenant, else 403."""

    def check(job_id: str, who: CurrentPrincipal, svc: Service) -> Principal:
        require(who, action, svc.owned(job_id=job_id))
        return who

    return check
