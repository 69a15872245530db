"""A real HTTP server for the API tests: uvicorn in a thread on a free local port, over a
fresh SQLite store in ``tmp_path``, with the local example cluster and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from allotment.api.app import create_app
from allotment.api.serving import serve_in_thread
from allotment.client import AllotmentClient
from allotment.domain.loading import load_cluster
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0  # every read moves on, so submit order is strict
        return self.now


@dataclass
class Server:
    url: str
    clock: FakeClock


serve = serve_in_thread


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    url = f"sqlite:///{tmp_path / 'allotment.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    clock = FakeClock()
    app = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(engine),
        clock=clock,
    )
    with serve(app) as base_url:
        yield Server(url=base_url, clock=clock)
    engine.dispose()


@pytest.fixture
def client(server: Server) -> Iterator[AllotmentClient]:
    with AllotmentClient(server.url, timeout=10) as c:
        yield c
