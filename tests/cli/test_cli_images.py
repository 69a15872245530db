"""``allot images`` against a real server (fake executor images): the table of images
and the nodes holding them, the tenant's view, ``-o json``, and plain processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.api.test_images import (
    BASE,
    CLUSTER,
    ENFORCED,
    NLP_SECRET,
    ON_NODES,
    STRAY,
    VISION_EVAL,
    VISION_TRAIN,
    Api,
    api,
)
from typer.testing import CliRunner

from allotment.cli.main import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("ALLOT_TOKEN", raising=False)
    monkeypatch.delenv("ALLOT_URL", raising=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Api]:
    with api(tmp_path, images=lambda: ON_NODES, enforcement=lambda: ENFORCED) as running:
        yield running


def allot(server: Api, user: str, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(
        app, ["images", *args, "--url", server.url, "--token", server.tokens[user]]
    )
    return result.exit_code, result.stdout, result.stderr


def test_an_admin_sees_each_image_with_its_nodes(server: Api) -> None:
    code, out, err = allot(server, "root")
    assert code == 0, err
    lines = out.splitlines()
    assert "images (runtime podman)" in out
    row = next(line for line in lines if NLP_SECRET in line)
    assert "all 2" in row  # on every node
    assert "n1" in next(line for line in lines if STRAY in line)
    assert "n2" in next(line for line in lines if VISION_EVAL in line)
    assert "your tenant may run" not in out
    assert "isolation" in out and "NOT enforced" in out


def test_a_member_sees_only_what_its_tenant_may_run(server: Api) -> None:
    code, out, err = allot(server, "bob")
    assert code == 0, err
    for image in (BASE, VISION_TRAIN, VISION_EVAL):
        assert image in out
    assert "nlp" not in out and STRAY not in out
    assert f"your tenant may run: {BASE}, registry.example.com/vision/*" in out


def test_json_is_the_api_answer(server: Api) -> None:
    code, out, err = allot(server, "bob", "-o", "json")
    assert code == 0, err
    assert json.loads(out) == server.get("bob")


def test_plain_processes_say_so(tmp_path: Path) -> None:
    process = CLUSTER.replace("kind: podman", "kind: process")
    with api(tmp_path, process, images=lambda: ON_NODES) as running:
        code, out, err = allot(running, "bob")
    assert code == 0, err
    assert "runtime process" in out and "plain processes" in out


def test_an_unreachable_server_is_an_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["images", "--url", "http://127.0.0.1:9", "--token", "x"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot reach the Allotment server")
