"""Property-based fuzzing of the API against its own OpenAPI document (schemathesis),
in-process over ASGI, on SQLite and on PostgreSQL: no request may produce a 5xx, and
every answer must match the schema (status, content type, body, headers, ``Allow``).

Half the generated job ids are swapped for a job that exists, so the fuzzer reaches past
the 404 into the handlers. Examples are bounded and derandomised: the run is short and
repeatable."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from sqlalchemy import Engine, text

from allotment.api.app import create_app
from allotment.api.service import JobService
from allotment.domain.loading import load_cluster
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import EXAMPLES, FakeClock
from tests.store.conftest import POSTGRES_URL, _postgres_unreachable

MAX_EXAMPLES = 25
JOB = """\
name: fuzz
queue: default
command: [python, -c, pass]
replicas: [{name: worker, count: 1, resources: {gpu: 1}}]
"""

# The schemas are loaded at import (schemathesis parametrises from them), so the stores
# live in places made here and removed when the module's tests end.
_root = tempfile.TemporaryDirectory(prefix="allot-fuzz-")
_engines: list[Engine] = []
_pg_schema = f"allot_fuzz_{uuid.uuid4().hex[:12]}"
_pg_skip = _postgres_unreachable()


def _schema(engine: Engine) -> tuple[schemathesis.BaseSchema, str]:
    _engines.append(engine)
    migrate.upgrade(engine)
    app = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
        work_root=Path(_root.name) / "work",
    )
    service: JobService = app.state.service
    job_id = service.submit(spec_text=JOB).id
    return schemathesis.openapi.from_asgi("/openapi.json", app), job_id


sqlite_schema, SQLITE_JOB = _schema(make_engine(f"sqlite:///{Path(_root.name) / 'a.db'}"))
if _pg_skip is None:
    _admin = make_engine(POSTGRES_URL)
    with _admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{_pg_schema}"'))
    pg_engine = make_engine(POSTGRES_URL, connect_args={"options": f"-c search_path={_pg_schema}"})
    pg_schema, PG_JOB = _schema(pg_engine)
else:  # the same operations, run against SQLite only to be skipped
    pg_schema, PG_JOB = sqlite_schema, SQLITE_JOB


@pytest.fixture(scope="module", autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    for engine in _engines:
        engine.dispose()
    if _pg_skip is None:
        with _admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{_pg_schema}" CASCADE'))
        _admin.dispose()
    _root.cleanup()


FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def _call(case: schemathesis.Case, job_id: str) -> None:
    given = case.path_parameters or {}
    if "job_id" in given and len(str(given["job_id"])) % 2 == 0:
        given["job_id"] = job_id
    response = case.call()
    if response.status_code == 413:  # a body over the byte cap: refused before parsing
        assert response.json()["code"] == "body_too_large"
        return
    # Schema-valid but semantically wrong text (a job or cluster file that does not
    # validate) is rightly refused with a documented 422: not a finding.
    case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance])


@sqlite_schema.parametrize()
@FUZZ
def test_fuzz_sqlite(case: schemathesis.Case) -> None:
    _call(case, SQLITE_JOB)


@pg_schema.parametrize()
@FUZZ
def test_fuzz_postgresql(case: schemathesis.Case) -> None:
    if _pg_skip is not None:
        pytest.skip(_pg_skip)
    _call(case, PG_JOB)
