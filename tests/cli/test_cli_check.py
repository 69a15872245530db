from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import allotment
from allotment.cli.main import app

runner = CliRunner()


def test_check_prints_a_summary(files: Path) -> None:
    result = runner.invoke(app, ["check", "-f", str(files / "cluster.yaml")])
    assert result.exit_code == 0, result.output
    for text in ("a100", "gpu_model=A100-80GB", "2 nodes, 8 GPUs", "vision", "team-a", "org"):
        assert text in result.stdout
    assert result.stderr == ""


def test_check_json(files: Path) -> None:
    result = runner.invoke(
        app, ["check", "-f", str(files / "cluster.yaml"), str(files / "job.yaml"), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    cluster = data["cluster"]
    assert (cluster["nodes"], cluster["gpus"], cluster["tenants"]) == (2, 8, ["vision"])
    assert cluster["pools"] == [
        {"name": "a100", "nodes": 2, "gpus": 8, "labels": {"gpu_model": "A100-80GB"}}
    ]
    (org,) = cluster["queues"]
    assert org["nominal_gpu"] == {"a100": 8}
    assert [(q["name"], q["nominal_gpu"], q["tenant"]) for q in org["children"]] == [
        ("team-a", {"a100": 4}, "vision"),
        ("team-b", {"a100": 4}, None),
    ]
    assert data["jobs"][0]["name"] == "resnet"
    assert data["jobs"][0]["gpus"] == 4
    assert data["errors"] == []


def test_bad_cluster_is_one_clear_message(files: Path) -> None:
    bad = files / "bad.yaml"
    bad.write_text("pools:\n  - name: a100\n    colour: blue\n")
    result = runner.invoke(app, ["check", "-f", str(bad)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "line 3: pools.0.colour: unknown key 'colour'" in result.stderr
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output


def test_job_for_an_unknown_queue_lists_the_leaves(files: Path) -> None:
    job = files / "lost.yaml"
    job.write_text((files / "job.yaml").read_text().replace("team-a", "team-z"))
    result = runner.invoke(
        app, ["check", "-f", str(files / "cluster.yaml"), str(files / "job.yaml"), str(job)]
    )
    assert result.exit_code == 1
    assert "unknown queue 'team-z'; queues you can submit to: team-a, team-b" in result.stderr
    assert "ok " in result.stdout and "resnet" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to check"),
        (["-f", "absent.yaml"], "absent.yaml: no such file"),
    ],
)
def test_check_usage_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["check", *args])
    assert result.exit_code == 1
    assert message in result.stderr


def _env() -> dict[str, str]:
    src = str(Path(allotment.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": src if not path else f"{src}{os.pathsep}{path}"}


def test_check_as_a_real_process(files: Path) -> None:
    command = [sys.executable, "-m", "allotment.cli.main", "check", "-f", "cluster.yaml"]
    done = subprocess.run(
        command, cwd=files, env=_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "8 GPUs" in done.stdout

    (files / "cluster.yaml").write_text("queues: [\n")
    done = subprocess.run(
        command, cwd=files, env=_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: cluster.yaml: 1 problem")
    assert "not valid YAML" in done.stderr
    assert "Traceback" not in done.stderr
