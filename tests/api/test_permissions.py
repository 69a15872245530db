"""The permission matrix, from one table: every route of the app, by every role, on an
object of the caller's own tenant or of another, against a real HTTP server with real
tokens. A route without a row fails the suite, and so does a row without a route.

The caller is of tenant ``vision`` (the platform admin has none); "own" objects belong
to ``vision``, "other" ones to ``nlp``. Objects of another tenant answer 404, never 403.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import BaseRoute, Route

from allotment.api.app import create_app
from allotment.api.auth import StoreTokens
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import serve
from tests.api.tenancy import CLUSTER, QUEUE, People, issue, job

ROLES = ("platform", "admin", "member", "viewer", "nobody")
CALLER = {"platform": "root", "admin": "alice", "member": "bob", "viewer": "carol"}
"""Who plays each role; ``nobody`` sends no token."""

Cell = tuple[int, int]
"""Expected status on an object of the caller's own tenant, and of another tenant."""


def row(platform: Cell, admin: Cell, member: Cell, viewer: Cell, nobody: Cell) -> dict[str, Cell]:
    return dict(zip(ROLES, (platform, admin, member, viewer, nobody), strict=True))


OPEN = row((200, 200), (200, 200), (200, 200), (200, 200), (200, 200))
READ = row((200, 200), (200, 200), (200, 200), (200, 200), (401, 401))
READ_OWN = row((200, 200), (200, 404), (200, 404), (200, 404), (401, 401))
PLATFORM_ONLY = row((200, 200), (403, 403), (403, 403), (403, 403), (401, 401))

MATRIX: dict[str, dict[str, Cell]] = {
    "POST /api/v1/jobs": row((201, 201), (201, 404), (201, 404), (403, 404), (401, 401)),
    "POST /api/v1/jobs:batch": row((201, 201), (201, 404), (201, 404), (403, 404), (401, 401)),
    "GET /api/v1/jobs": READ,
    "GET /api/v1/jobs/{job_id}": READ_OWN,
    "POST /api/v1/jobs/{job_id}/cancel": row(
        (200, 200), (200, 404), (200, 404), (403, 404), (401, 401)
    ),
    "GET /api/v1/jobs/{job_id}/events": READ_OWN,
    "GET /api/v1/jobs/{job_id}/why": READ_OWN,
    "GET /api/v1/jobs/{job_id}/logs": READ_OWN,
    "GET /api/v1/queues": READ,
    "GET /api/v1/pools": READ,
    "GET /api/v1/nodes": READ,
    "GET /api/v1/images": READ,
    "GET /api/v1/cluster": PLATFORM_ONLY,
    "PUT /api/v1/cluster": PLATFORM_ONLY,
    "POST /api/v1/tokens": row((201, 201), (201, 404), (403, 404), (403, 404), (401, 401)),
    "GET /api/v1/tokens": row((200, 200), (200, 200), (403, 403), (403, 403), (401, 401)),
    "DELETE /api/v1/tokens/{token_id}": row(
        (200, 200), (200, 404), (403, 404), (403, 404), (401, 401)
    ),
    "GET /api/v1/audit": row((200, 200), (200, 200), (403, 403), (403, 403), (401, 401)),
    "GET /api/v1/whatif": row((200, 200), (200, 200), (403, 403), (403, 403), (401, 401)),
    "POST /api/v1/whatif": row((200, 200), (200, 200), (403, 403), (403, 403), (401, 401)),
    "GET /api/v1/history/export": row((200, 200), (200, 200), (403, 403), (403, 403), (401, 401)),
    "GET /api/v1/audit/verify": PLATFORM_ONLY,
    "GET /api/v1/report": READ,
    "GET /api/v1/alerts": READ,
    "GET /metrics": PLATFORM_ONLY,
    "POST /api/v1/services": row((201, 201), (201, 404), (201, 404), (403, 404), (401, 401)),
    "GET /api/v1/services": READ,
    "GET /api/v1/services/{tenant}/{name}": READ_OWN,
    "DELETE /api/v1/services/{tenant}/{name}": row(
        (200, 200), (200, 404), (200, 404), (403, 404), (401, 401)
    ),
    **{
        f"{method} /svc/{{tenant}}/{{name}}/{{path:path}}": row(
            (503, 503), (503, 404), (503, 404), (503, 404), (401, 401)
        )
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    },
    **{
        f"{method} /nb/{{job_id}}/{{path:path}}": row(
            (503, 503), (503, 404), (503, 404), (403, 404), (401, 401)
        )
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    },
    "GET /api/v1/healthz": OPEN,
    "GET /": READ,
    "GET /ui/fragments/overview": READ,
    "GET /ui/reports": READ,
    "GET /ui/queues/{name}": READ_OWN,
    "GET /ui/fragments/queues/{name}": READ_OWN,
    "GET /ui/admin": row((200, 200), (200, 200), (403, 403), (403, 403), (401, 401)),
    "POST /ui/admin/tokens/{token_id}/revoke": row(
        (200, 200), (200, 404), (403, 404), (403, 404), (401, 401)
    ),
    "GET /ui/reports.csv": READ,
    "GET /ui/jobs/{job_id}": READ_OWN,
    "GET /ui/fragments/jobs/{job_id}": READ_OWN,
    "POST /ui/jobs/{job_id}/cancel": row(
        (200, 200), (200, 404), (200, 404), (403, 404), (401, 401)
    ),
    "GET /openapi.json": OPEN,
    "GET /docs": OPEN,
    "GET /docs/oauth2-redirect": OPEN,
    "GET /redoc": OPEN,
}


@dataclass
class World:
    url: str
    sessions: sessionmaker[Session]
    people: People
    services: int = 0

    def job(self, tenant: str) -> str:
        """A fresh job of ``tenant``, submitted by its member (bob or nick)."""
        member = "bob" if tenant == "vision" else "nick"
        job_id: str = self.people[member].submit(job(QUEUE[tenant]))["id"]
        return job_id

    def fresh(self, tenant: str) -> str:
        """The file of a service of ``tenant`` with a name not used before."""
        self.services += 1
        spec = json.loads(job(QUEUE[tenant], name=f"s{self.services}")) | {"type": "service"}
        return json.dumps(spec)

    def service(self, tenant: str) -> str:
        """A fresh service of ``tenant``, applied by its member: ``tenant/name``."""
        member = "bob" if tenant == "vision" else "nick"
        applied = self.people[member].apply_service(self.fresh(tenant))
        return f"{tenant}/{applied['name']}"

    def notebook(self, tenant: str) -> str:
        """A fresh notebook job of ``tenant`` (its own command), started by the caller's
        counterpart: bob for vision (so the member caller, bob, owns it), nick for nlp."""
        member = "bob" if tenant == "vision" else "nick"
        spec = json.loads(job(QUEUE[tenant])) | {"type": "notebook"}
        job_id: str = self.people[member].submit(json.dumps(spec))["id"]
        return job_id

    def token(self, tenant: str) -> str:
        """A fresh token id of a member of ``tenant``."""
        user = "dave" if tenant == "vision" else "nick"
        return issue(self.sessions, user, tenant, "member")[0]


def _keys(routes: Sequence[BaseRoute], prefix: str = "") -> set[str]:
    """``METHOD path`` of every route, descending into included routers (FastAPI keeps
    those as wrappers that name the ``original_router``)."""
    keys: set[str] = set()
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            context = getattr(route, "include_context", None)
            keys |= _keys(included.routes, prefix + str(getattr(context, "prefix", "")))
        elif isinstance(route, APIRoute | Route):
            for method in (route.methods or set()) - {"HEAD"}:
                keys.add(f"{method} {prefix}{route.path}")
    return keys


def _app_keys() -> set[str]:
    app = create_app(cluster=load_cluster_text(CLUSTER), store_sessions=sessionmaker())
    return _keys(app.routes)


Request = tuple[str, str, dict[str, object] | None]
"""Method, path, JSON body."""

BUILD: dict[str, Callable[[World, str], Request]] = {
    "POST /api/v1/jobs": lambda w, t: ("POST", "/api/v1/jobs", {"spec": job(QUEUE[t])}),
    "POST /api/v1/jobs:batch": lambda w, t: (
        "POST",
        "/api/v1/jobs:batch",
        {"specs": [job(QUEUE[t]), job(QUEUE[t])]},
    ),
    "GET /api/v1/jobs": lambda w, t: ("GET", f"/api/v1/jobs?queue={QUEUE[t]}", None),
    "GET /api/v1/jobs/{job_id}": lambda w, t: ("GET", f"/api/v1/jobs/{w.job(t)}", None),
    "POST /api/v1/jobs/{job_id}/cancel": lambda w, t: (
        "POST",
        f"/api/v1/jobs/{w.job(t)}/cancel",
        None,
    ),
    "GET /api/v1/jobs/{job_id}/events": lambda w, t: (
        "GET",
        f"/api/v1/jobs/{w.job(t)}/events",
        None,
    ),
    "GET /api/v1/jobs/{job_id}/why": lambda w, t: ("GET", f"/api/v1/jobs/{w.job(t)}/why", None),
    "GET /api/v1/jobs/{job_id}/logs": lambda w, t: ("GET", f"/api/v1/jobs/{w.job(t)}/logs", None),
    "GET /ui/jobs/{job_id}": lambda w, t: ("GET", f"/ui/jobs/{w.job(t)}", None),
    "GET /ui/fragments/jobs/{job_id}": lambda w, t: (
        "GET",
        f"/ui/fragments/jobs/{w.job(t)}",
        None,
    ),
    "GET /ui/queues/{name}": lambda w, t: ("GET", f"/ui/queues/{QUEUE[t]}", None),
    "GET /ui/fragments/queues/{name}": lambda w, t: (
        "GET",
        f"/ui/fragments/queues/{QUEUE[t]}",
        None,
    ),
    "POST /ui/admin/tokens/{token_id}/revoke": lambda w, t: (
        "POST",
        f"/ui/admin/tokens/{w.token(t)}/revoke",
        None,
    ),
    "POST /ui/jobs/{job_id}/cancel": lambda w, t: ("POST", f"/ui/jobs/{w.job(t)}/cancel", None),
    "PUT /api/v1/cluster": lambda w, t: ("PUT", "/api/v1/cluster", {"text": CLUSTER}),
    "POST /api/v1/whatif": lambda w, t: ("POST", "/api/v1/whatif", {"text": CLUSTER}),
    "GET /api/v1/audit": lambda w, t: ("GET", f"/api/v1/audit?tenant={t}", None),
    "POST /api/v1/tokens": lambda w, t: (
        "POST",
        "/api/v1/tokens",
        {"user": "dave" if t == "vision" else "nick", "tenant": t, "role": "member"},
    ),
    "DELETE /api/v1/tokens/{token_id}": lambda w, t: (
        "DELETE",
        f"/api/v1/tokens/{w.token(t)}",
        None,
    ),
    **{
        f"{method} /nb/{{job_id}}/{{path:path}}": (
            lambda m: lambda w, t: (m, f"/nb/{w.notebook(t)}/api/status", None)
        )(method)
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    },
    "POST /api/v1/services": lambda w, t: ("POST", "/api/v1/services", {"spec": w.fresh(t)}),
    "GET /api/v1/services/{tenant}/{name}": lambda w, t: (
        "GET",
        f"/api/v1/services/{w.service(t)}",
        None,
    ),
    "DELETE /api/v1/services/{tenant}/{name}": lambda w, t: (
        "DELETE",
        f"/api/v1/services/{w.service(t)}",
        None,
    ),
    **{
        f"{method} /svc/{{tenant}}/{{name}}/{{path:path}}": (
            lambda m: lambda w, t: (m, f"/svc/{w.service(t)}/x?y=1", None)
        )(method)
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    },
}
"""How to make the request for a route and a tenant's object; others are plain GETs."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root: Path = tmp_path_factory.mktemp("matrix")
    engine = make_engine(f"sqlite:///{root / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    app = create_app(
        cluster=load_cluster_text(CLUSTER),
        store_sessions=sessions,
        clock=time.time,
        authenticator=StoreTokens(sessions, clock=time.time),
    )
    app.state.proxy_wait_s = 0.0  # no controller here: a service never has a ready replica
    with serve(app) as url:
        people = People.issued(url, sessions)
        try:
            yield World(url=url, sessions=sessions, people=people)
        finally:
            people.close()
    engine.dispose()


def test_every_route_has_a_row_and_every_row_a_route() -> None:
    keys = _app_keys()
    assert sorted(keys - MATRIX.keys()) == [], "routes without a row in MATRIX"
    assert sorted(MATRIX.keys() - keys) == [], "rows of MATRIX without a route"
    assert all(set(cells) == set(ROLES) for cells in MATRIX.values())


CASES = [
    pytest.param(key, role, tenant, id=f"{key}|{role}|{'own' if tenant == 'vision' else 'other'}")
    for key in sorted(MATRIX)
    for role in ROLES
    for tenant in ("vision", "nlp")
]


@pytest.mark.parametrize(("key", "role", "tenant"), CASES)
def test_permission(world: World, key: str, role: str, tenant: str) -> None:
    own, other = MATRIX[key][role]
    expected = own if tenant == "vision" else other
    build = BUILD.get(key)
    method, path, body = build(world, tenant) if build else ("GET", key.split(" ", 1)[1], None)
    headers = {}
    if role != "nobody":
        headers["Authorization"] = f"Bearer {world.people.tokens[CALLER[role]]}"
    response = httpx.request(
        method, world.url + path, json=body, headers=headers, timeout=10, follow_redirects=False
    )
    assert response.status_code == expected, (key, role, tenant, response.text[:300])
    if expected in (401, 403, 404) and path.startswith("/api/"):
        code = {401: "unauthenticated", 403: "forbidden", 404: "not_found"}[expected]
        assert response.json()["code"] == code
