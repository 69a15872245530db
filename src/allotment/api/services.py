"""What the API does with services, without HTTP: apply (create or update), read, list,
delete, and find the ready replicas the proxy sends a request to.

A service's spec is checked exactly as a job file is (queue, submit rights, pools,
image, mounts, that one replica fits a node), then stored; the service controller
(:mod:`allotment.control.services`) starts its replicas as jobs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from allotment.api.policy import Owned
from allotment.api.schemas import Output, ReasonOut
from allotment.api.service import SPEC_SOURCE, JobService
from allotment.domain.cluster import Queue
from allotment.domain.errors import ConfigError, Issue, NotFound
from allotment.domain.job import JobType
from allotment.domain.lifecycle import JobState
from allotment.domain.service import PORT_ENV, ServiceSettings
from allotment.domain.tenancy import DEFAULT_TENANT
from allotment.store import jobs as job_store
from allotment.store import services as service_store
from allotment.store.jobs import jobs_by_id
from allotment.store.models import Job, Service

PROXY_PREFIX = "/svc"
"""Where the API server proxies services: ``/svc/<tenant>/<service>/...``."""


class ReplicaOut(Output):
    job: str
    generation: int
    state: str
    ready: bool


class ServiceOut(Output):
    id: str
    name: str
    tenant: str
    queue: str
    user: str
    priority_class: str
    generation: int
    public: bool
    min_replicas: int
    max_replicas: int
    desired: int
    ready: int
    restarts: int
    reason: ReasonOut | None
    path: str
    """The service's address on the API server: ``/svc/<tenant>/<name>/``."""
    url: str | None = None
    """``path`` on the server that answered."""
    replicas: list[ReplicaOut]
    spec: dict[str, Any]
    created_at: float
    updated_at: float


class ServiceList(Output):
    services: list[ServiceOut]


def proxy_path(tenant: str, name: str) -> str:
    return f"{PROXY_PREFIX}/{tenant}/{name}/"


def service_out(session: Session, service: Service) -> ServiceOut:
    spec = service_store.settings_of(service)
    assert spec.service is not None
    live = [r for r in service.replicas if not r.get("retired")]
    states = {j.id: j.state for j in jobs_by_id(session, [r["job"] for r in live])}
    reason = None
    if service.reason_code is not None:
        reason = ReasonOut(code=service.reason_code, message=service.reason_message or "")
    return ServiceOut(
        id=service.id,
        name=service.name,
        tenant=service.tenant,
        queue=service.queue,
        user=service.user,
        priority_class=service.priority_class,
        generation=service.generation,
        public=spec.service.public,
        min_replicas=spec.service.replicas.min,
        max_replicas=spec.service.replicas.max,
        desired=service.desired,
        ready=sum(1 for r in live if r.get("ready")),
        restarts=service.restarts,
        reason=reason,
        path=proxy_path(service.tenant, service.name),
        replicas=[
            ReplicaOut(
                job=r["job"],
                generation=r["generation"],
                state=states.get(r["job"], "unknown"),
                ready=bool(r.get("ready")),
            )
            for r in live
        ],
        spec=dict(service.spec),
        created_at=service.created_at,
        updated_at=service.updated_at,
    )


@dataclass(frozen=True, slots=True)
class Route:
    """Where the proxy may send a request for one service now."""

    service_id: str
    ports: tuple[int, ...]
    """The ready replicas' ports."""
    code: str
    """The service's reason code, or the notebook job's state."""
    reason: str
    """Why none is ready, when none is."""
    wait: bool = True
    """Whether a request should wait for one to answer (not in a crash loop, not for a
    notebook that is not running)."""
    public: bool = False
    """Whether it answers without a token."""


class Services:
    """The API's operations on services, on the job service's cluster and store."""

    def __init__(self, jobs: JobService, *, route_ttl_s: float = 0.25) -> None:
        self.jobs = jobs
        self.sessions: sessionmaker[Session] = jobs.sessions
        self._route_ttl_s = route_ttl_s
        self._routes: dict[tuple[str, str], tuple[float, Route | None]] = {}
        self._lock = threading.Lock()

    def apply(
        self,
        *,
        spec_text: str,
        user: str,
        may_submit: Callable[[Queue], None] | None = None,
    ) -> tuple[ServiceOut, bool]:
        """Create the service a ``type: service`` file describes, or update the one of
        its name in its tenant (its replicas roll over to the new spec). Return it and
        whether it was created."""
        spec, queue, priority = self.jobs.check_spec(spec_text, SPEC_SOURCE, may_submit)
        if spec.type is not JobType.SERVICE:
            issue = Issue(path="type", message="a service's file needs type: service")
            raise ConfigError([issue], source=SPEC_SOURCE)
        settings = spec.service or ServiceSettings()
        spec = spec.model_copy(update={"service": settings})
        tenant = queue.tenant or DEFAULT_TENANT
        declared = self.jobs.cluster.tenants.get(tenant)
        if settings.public and not (declared is not None and declared.public_services):
            issue = Issue(
                path="service.public",
                message=f"tenant {tenant} does not allow public services: a platform admin "
                "sets public_services: true on the tenant in cluster.yaml",
            )
            raise ConfigError([issue], source=SPEC_SOURCE)
        with self.sessions.begin() as session:
            found = service_store.find_service(session, tenant, spec.name)
            service, _ = service_store.apply_service(
                session,
                spec,
                tenant=tenant,
                user=user,
                priority_class=priority.name,
                at=self.jobs.clock(),
            )
            return service_out(session, service), found is None

    def owned(self, *, tenant: str, name: str) -> Owned:
        """What authorisation looks at in a service; raises ``NotFound``."""
        with self.sessions() as session:
            found = service_store.get_service(session, tenant, name)
            return Owned(kind="service", name=name, tenant=found.tenant, user=found.user)

    def get(self, *, tenant: str, name: str) -> ServiceOut:
        with self.sessions() as session:
            return service_out(session, service_store.get_service(session, tenant, name))

    def list(self, *, tenant: str | None) -> ServiceList:
        with self.sessions() as session:
            rows = service_store.list_services(session, tenant=tenant)
            return ServiceList(services=[service_out(session, s) for s in rows])

    def delete(self, *, tenant: str, name: str, user: str) -> ServiceOut:
        """Stop every replica and forget the service; return it as it was."""
        with self.sessions.begin() as session:
            service = service_store.get_service(session, tenant, name, for_update=True)
            out = service_out(session, service)
            service_store.delete_service(session, service, at=self.jobs.clock(), by=user)
        return out

    def route(self, tenant: str, name: str) -> Route | None:
        """Where a request for the service may go now (read at most every
        ``route_ttl_s``); ``None`` for an unknown service."""
        return self._cached((tenant, name), lambda: self.route_of(self.sessions, tenant, name))

    def _cached(self, key: tuple[str, str], read: Callable[[], Route | None]) -> Route | None:
        now = time.monotonic()
        with self._lock:
            cached = self._routes.get(key)
        if cached is not None and now - cached[0] < self._route_ttl_s:
            return cached[1]
        route = read()
        with self._lock:
            self._routes[key] = (now, route)
        return route

    @staticmethod
    def route_of(sessions: sessionmaker[Session], tenant: str, name: str) -> Route | None:
        """Where a request for the service may go, read from the store now."""
        with sessions() as session:
            found = service_store.find_service(session, tenant, name)
            if found is None:
                return None
            ports = tuple(
                int(r["port"]) for r in found.replicas if r.get("ready") and not r.get("retired")
            )
            code = found.reason_code or "starting"
            settings = dict(found.spec.get("service") or {})
            return Route(
                found.id,
                ports,
                code,
                found.reason_message or "no replica is ready yet",
                wait=code != "crash_loop",
                public=settings.get("public") is True,
            )

    def notebook_owned(self, job_id: str) -> Owned:
        """What authorisation looks at in a notebook job; raises ``NotFound`` for a job
        that is not a notebook."""
        with self.sessions() as session:
            job = job_store.get_job(session, job_id)
            if job.type != JobType.NOTEBOOK.value:
                raise NotFound("notebook", job_id)
            return Owned(kind="notebook", name=job_id, tenant=job.tenant, user=job.user)

    def notebook_route(self, job_id: str) -> Route | None:
        """Where a request for notebook ``job_id`` may go: its port while it runs (read
        at most every ``route_ttl_s``); ``None`` for a job that is not a notebook."""
        return self._cached(("", job_id), lambda: self._notebook_route(job_id))

    def _notebook_route(self, job_id: str) -> Route | None:
        with self.sessions() as session:
            found = session.get(Job, job_id)
            if found is None or found.type != JobType.NOTEBOOK.value:
                return None
            port = dict(found.spec.get("env") or {}).get(PORT_ENV)
            running = found.state == JobState.RUNNING.value and port is not None
            said = found.state
            if found.state == JobState.PENDING.value and found.reason_message:
                said += f" ({found.reason_message})"
            return Route(
                found.id,
                (int(port),) if running and port is not None else (),
                found.state,
                f"it is {said}",
                wait=running,
            )

    def forget_route(self, tenant: str, name: str) -> None:
        """Read the service's ready replicas again at the next request."""
        with self._lock:
            self._routes.pop((tenant, name), None)
