"""``allot ls`` and ``allot get`` never send a stored name's control characters (terminal
escapes, line breaks) or Rich markup to the terminal: they are shown escaped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update
from tests.accounting import rows
from tests.api.conftest import EXAMPLES, serve
from typer.testing import CliRunner

from allotment.api.app import create_app
from allotment.cli.main import app
from allotment.domain.loading import load_cluster
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from allotment.store.models import Job

EVIL = "e\x1b[2J\nx [b]y[/b]\x07\u202e"
runner = CliRunner()


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    engine = make_engine(f"sqlite:///{tmp_path / 'allotment.db'}")
    migrate.upgrade(engine)
    sessions = session_factory(engine)
    with sessions.begin() as db:  # stored before names were checked
        rows.job(db, "j-old", tenant="default", queue="default", state="pending")
        db.execute(update(Job).where(Job.id == "j-old").values(name=EVIL))
    application = create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=sessions,
        clock=lambda: 1_800_000_000.0,
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("ALLOT_TOKEN", raising=False)
    with serve(application) as url:
        monkeypatch.setenv("ALLOT_URL", url)
        yield url
    engine.dispose()


@pytest.mark.parametrize("command", [["ls"], ["get", "j-old"]])
def test_fault_control_characters_in_a_stored_name_are_printed_escaped(
    server: str, command: list[str]
) -> None:
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "e\\x1b[2J\\nx [b]y[/b]\\x07\\u202e" in out  # one line, markup as written
