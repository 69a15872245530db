"""``allot report`` against a real server (uvicorn on 127.0.0.1 over a filled store):
table, CSV, HTML and JSON, and a clear error for a bad window."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from tests.accounting import rows
from tests.api.conftest import serve
from tests.api.tenancy import CLUSTER
from typer.testing import CliRunner

from allotment.api.app import create_app
from allotment.cli.main import app
from allotment.domain.loading import load_cluster_text
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.web.report import CSV_COLUMNS

PRICED = CLUSTER.replace("pools: [{name: local}]", "pools: [{name: local, price_per_gpu_hour: 3}]")
T0 = 1_800_000_000.0
NOW = T0 + 86400.0
EVIL = "<script>alert('x')</script>&"
runner = CliRunner()


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as db:
        rows.job(db, "j-v1", tenant="vision", queue="vision-q", user=EVIL, state="succeeded")
        rows.attempt(
            db,
            "j-v1",
            1,
            pool="local",
            start=T0 + 3600,
            end=T0 + 4 * 3600,
            gpus=2,
            cpu=4,
            memory_gib=8,
            state="preempted",
        )
        rows.usage(db, "j-v1", 1, start=T0 + 3600, length=7200, util=75)
        rows.event(db, "j-v1", T0 + 3000, "pending")
        rows.event(db, "j-v1", T0 + 3600, "admitted")
        rows.event(db, "j-v1", T0 + 4 * 3600, "preempted", detail={"cause": "reclaim"})
        rows.job(db, "j-n1", tenant="nlp", queue="nlp-q", user="nick", state="failed")
        rows.attempt(
            db,
            "j-n1",
            1,
            pool="local",
            start=T0 + 7200,
            end=T0 + 9000,
            gpus=1,
            state="failed",
            failure_class="oom",
        )
    application = create_app(
        cluster=load_cluster_text(PRICED), store_sessions=sessions, clock=lambda: NOW
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("ALLOT_TOKEN", raising=False)
    with serve(application) as url:
        monkeypatch.setenv("ALLOT_URL", url)
        yield url
    engine.dispose()


def allot(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_table(server: str) -> None:
    code, out, err = allot("report", "--since", "1d")
    assert code == 0, err
    for heading in ("usage and cost by tenant", "wait times", "failures", "preemptions"):
        assert heading in out
    assert "vision" in out and "nlp" in out and "18.00" in out and "oom" in out
    assert "reclaim" in out and "all tenants" in out
    assert "GPU-h interrupted" in out


def test_csv_has_one_header_and_exact_sums(server: str, tmp_path: Path) -> None:
    code, out, err = allot("report", "--since", "1d", "--format", "csv")
    assert code == 0, err
    table = list(csv.reader(io.StringIO(out)))
    assert table[0] == ["tenant", *CSV_COLUMNS]
    assert [r[0] for r in table[1:]] == ["nlp", "vision"]
    data = json.loads(allot("report", "--since", "1d", "-o", "json")[1])
    cost = table[0].index("cost")
    assert sum(Decimal(r[cost]) for r in table[1:]) == Decimal(repr(data["total"]["cost"])) == 19.5
    interrupted = table[0].index("interrupted_gpu_hours")
    # j-v1 was preempted after holding 2 GPUs for 3 hours: all of it interrupted.
    assert {r[0]: r[interrupted] for r in table[1:]} == {"nlp": "0", "vision": "6"}
    assert data["total"]["interrupted_gpu_hours"] == 6
    code, _, err = allot(
        "report", "--by", "user", "--format", "csv", "--out", str(tmp_path / "u.csv")
    )
    assert code == 0 and "wrote" in err
    written = list(csv.reader((tmp_path / "u.csv").open()))
    assert written[0][0] == "user" and {r[0] for r in written[1:]} == {EVIL, "nick"}


def test_html_is_self_contained_and_escaped(server: str, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    code, _, err = allot(
        "report",
        "--since",
        "1d",
        "--by",
        "user",
        "--format",
        "html",
        "--jobs",
        "--out",
        str(target),
    )
    assert code == 0, err
    html = target.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert html.count('src="data:image/png;base64,') == 4
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "<script" not in html and "<link" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;" in html
    assert "j-v1" in html and "oom" in html


def test_bad_since_is_a_clear_error(server: str) -> None:
    code, out, err = allot("report", "--since", "last week")
    assert code == 1 and out == ""
    assert "since" in err and "duration" in err
    code, _, err = allot("report", "--by", "colour")
    assert code == 2 and "colour" in err


def test_fault_a_window_of_a_microsecond_is_a_clear_error(server: str) -> None:
    code, out, err = allot("report", "--since", "0.000001")
    assert code == 1 and out == ""
    assert "at least 1 second" in err and "internal" not in err
