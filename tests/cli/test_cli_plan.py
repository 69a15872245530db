"""``allot plan``: one real cycle on an empty cluster, with reasons and estimates."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from allotment.cli.main import app

runner = CliRunner()

BIG = """\
name: big
queue: team-b
replicas:
  - {name: worker, count: 2, resources: {gpu: 4}}
max_runtime: 2h
"""


def test_plan_places_then_explains(files: Path) -> None:
    (files / "big.yaml").write_text(BIG)
    job = str(files / "job.yaml")
    result = runner.invoke(
        app,
        [
            "plan",
            "-f",
            str(files / "cluster.yaml"),
            job,
            job,
            str(files / "big.yaml"),
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["decision"] for r in rows] == ["admitted", "admitted", "waiting"]
    first = rows[0]
    assert first["pool"] == "a100"
    assert [p["replica"] for p in first["placements"]] == ["worker-0", "worker-1"]
    assert all(len(p["devices"]) == 2 for p in first["placements"])
    used = {(p["node"], d) for r in rows[:2] for p in r["placements"] for d in p["devices"]}
    assert len(used) == 8  # no device given twice
    waiting = rows[2]
    assert waiting["reason"]["code"] in {"quota_exhausted", "no_node_fits", "gang_unsatisfiable"}
    assert waiting["estimated_start"] is None  # the resnet jobs declare no runtime


def test_plan_table_and_errors(files: Path) -> None:
    result = runner.invoke(
        app, ["plan", "-f", str(files / "cluster.yaml"), str(files / "job.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert "admitted" in result.stdout
    (files / "bad.yaml").write_text("name: x\nqueue: nope\nreplicas: [{count: 1}]\n")
    result = runner.invoke(
        app, ["plan", "-f", str(files / "cluster.yaml"), str(files / "bad.yaml")]
    )
    assert result.exit_code == 1
    assert "unknown queue 'nope'" in result.stderr
    assert "team-a" in result.stderr
    assert "Traceback" not in result.output
