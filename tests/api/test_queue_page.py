"""A queue's dashboard page over HTTP: who borrows from whom (named only for those who
may see the queue), and its line computed once per change for all its viewers."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from allotment.api import explain
from allotment.api.app import create_app
from allotment.api.auth import StoreTokens
from allotment.api.queue_view import SharedViews
from allotment.client import AllotmentClient
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster, load_cluster_text
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import EXAMPLES, FakeClock, serve
from tests.api.live import Live, live_stack
from tests.api.tenancy import issue, job

# 4 GPUs, all of them some queue's quota: train borrows what tune and nlp-q leave.
CLUSTER = """
pools: [{name: local}]
nodes: [{name: box, pool: local, capacity: {gpu: 4, cpu: 16, memory: 64Gi}}]
tenants:
  - {name: vision, members: [{user: bob, role: member}]}
  - {name: nlp, members: [{user: nick, role: member}]}
queues:
  - name: root
    children:
      - {name: train, tenant: vision, quota: {local: {gpu: 1}}}
      - {name: tune, tenant: vision, quota: {local: {gpu: 2}}}
      - {name: nlp-q, tenant: nlp, quota: {local: {gpu: 1}}}
"""
SLEEP = "import time; time.sleep(60)"


class Tables(HTMLParser):
    """The rows (cells' text) of each table with a ``data-testid``."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("data-testid")
            if self._table:
                self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._table and self._row:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def lent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, dict[str, str]]]:
    """train runs 2 GPUs on a quota of 1: one borrowed, from tune (2 unused) and
    nlp-q (1 unused)."""
    root = tmp_path_factory.mktemp("lent")
    with live_stack(
        root,
        cluster=load_cluster_text(CLUSTER),
        authenticator=lambda sessions: StoreTokens(sessions, clock=time.time),
    ) as stack:
        tokens = {
            user: issue(stack.sessions, user, tenant, role)[1]
            for user, tenant, role in (
                ("root", None, "admin"),
                ("bob", "vision", "member"),
                ("nick", "nlp", "member"),
            )
        }
        with AllotmentClient(stack.url, tokens["bob"], timeout=20) as bob:
            running = bob.submit(job("train", SLEEP, gpus=2, name="vision-secret"))["id"]
        stack.until(running, {JobState.RUNNING})
        yield stack, tokens


def page(live: Live, token: str, queue: str) -> tuple[str, dict[str, list[list[str]]]]:
    answer = httpx.get(
        f"{live.url}/ui/queues/{queue}", headers={"Authorization": f"Bearer {token}"}, timeout=20
    )
    assert answer.status_code == 200, answer.text[:300]
    return answer.text, Tables(answer.text).tables


def test_a_borrowers_page_names_its_lenders(lent: tuple[Live, dict[str, str]]) -> None:
    live, tokens = lent
    html, tables = page(live, tokens["root"], "train")
    assert tables["borrows-from"] == [["local", "tune", "0.67"], ["local", "nlp-q", "0.33"]]
    assert tables["lends-to"] == [["lends nothing"]]
    assert 'data-testid="split-note"' in html and "share of the unused quota" in html
    # A member of its tenant sees its own tenant's lender by name, the other's not.
    html, tables = page(live, tokens["bob"], "train")
    assert tables["borrows-from"] == [
        ["local", "tune", "0.67"],
        ["local", "another tenant", "0.33"],
    ]
    assert "nlp-q" not in html


def test_a_lenders_page_names_its_borrower(lent: tuple[Live, dict[str, str]]) -> None:
    live, tokens = lent
    html, tables = page(live, tokens["bob"], "tune")
    assert tables["lends-to"] == [["local", "train", "0.67"]]
    assert tables["borrows-from"] == [["borrows nothing"]]
    assert 'href="/ui/queues/train"' in html


def test_another_tenants_queue_names_do_not_leak(lent: tuple[Live, dict[str, str]]) -> None:
    live, tokens = lent
    html, tables = page(live, tokens["nick"], "nlp-q")
    assert tables["lends-to"] == [["local", "another tenant", "0.33"]]
    for name in ("train", "tune", "vision-secret"):
        assert not re.search(rf"\b{name}\b", html), name
    fragment = httpx.get(
        f"{live.url}/ui/fragments/queues/nlp-q",
        headers={"Authorization": f"Bearer {tokens['nick']}"},
        timeout=20,
    )
    assert fragment.status_code == 200 and not re.search(r"\btrain\b", fragment.text)
    # And the borrower's page is not theirs to read at all.
    other = httpx.get(
        f"{live.url}/ui/queues/train",
        headers={"Authorization": f"Bearer {tokens['nick']}"},
        timeout=20,
    )
    assert other.status_code == 404


class Monotonic:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_refreshes_without_a_change_compute_the_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    app = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
    )
    ticks = Monotonic()
    app.state.service.lines = SharedViews(clock=ticks)
    computed: list[str] = []
    real = explain.queue_line

    def counting(*args: Any, **kwargs: Any) -> list[dict[str, object]]:
        computed.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(explain, "queue_line", counting)
    with serve(app) as url, AllotmentClient(url, timeout=20) as client:
        first = client.submit(job("default", SLEEP, gpus=1, name="first"))["id"]

        def refresh() -> str:
            answer = httpx.get(f"{url}/ui/fragments/queues/default", timeout=20)
            assert answer.status_code == 200
            return answer.text

        assert first in refresh() and first in refresh()
        assert computed == ["default"]  # the second refresh used the first's line
        second = client.submit(job("default", SLEEP, gpus=1, name="second"))["id"]
        seen = refresh()
        assert first in seen and second in seen  # a new submission shows at once
        assert computed == ["default"] * 2
        ticks.now += 2.5  # nothing changed, but the answer is older than its TTL
        refresh()
        assert computed == ["default"] * 3
    engine.dispose()


def test_viewers_arriving_together_wait_for_one_computation() -> None:
    views: SharedViews[int] = SharedViews()
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def slow() -> int:
        calls.append(1)
        started.set()
        release.wait(10)
        return 42

    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(views.get("q", ("mark",), slow)))
        for _ in range(8)
    ]
    threads[0].start()
    assert started.wait(10)
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.2)  # the others are waiting for the first one's answer
    release.set()
    for thread in threads:
        thread.join(10)
    assert answers == [42] * 8 and calls == [1]
    assert views.get("q", ("moved",), lambda: 7) == 7  # a new mark: computed again


def test_bounded_views_keep_the_names_asked_last_only() -> None:
    views: SharedViews[str] = SharedViews(max_names=2)
    calls: list[str] = []

    def compute(name: str) -> str:
        calls.append(name)
        return name.upper()

    for name in ("a", "b", "a", "c"):  # "a" again from memory, then "c" pushes out "b"
        assert views.get(name, (), partial(compute, name)) == name.upper()
    assert calls == ["a", "b", "c"]
    assert views.get("a", (), partial(compute, "a")) == "A" and calls == ["a", "b", "c"]
    assert views.get("b", (), partial(compute, "b")) == "B" and calls[-1] == "b"


def test_the_overview_says_what_each_queue_lends(lent: tuple[Live, dict[str, str]]) -> None:
    live, tokens = lent
    answer = httpx.get(
        f"{live.url}/", headers={"Authorization": f"Bearer {tokens['root']}"}, timeout=20
    )
    assert answer.status_code == 200
    rows = {row[0]: row for row in Tables(answer.text).tables["queues"]}
    # queue, tenant, pool, nominal, used, borrowed, lent, ...
    assert rows["tune"][6] == "0.67" and rows["nlp-q"][6] == "0.33"
    assert rows["train"][5] == "1" and rows["train"][6] == "0"
