"""``allot synth gang-heavy``: writes a trace and its cluster that ``allot sim`` replays;
bad input is one ``error:`` line and exit status 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from allotment.cli.main import app

runner = CliRunner()
SMALL = ["--nodes", "8", "--days", "0.25", "--seed", "7"]


def synth(out: Path, *args: str) -> object:
    return runner.invoke(app, ["synth", "gang-heavy", "--out", str(out), *args])


def test_writes_files_that_sim_replays(tmp_path: Path) -> None:
    out = tmp_path / "w"
    result = synth(out, *SMALL, "--load", "0.85")
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'trace.csv'}" in result.stdout
    assert f"wrote {out / 'cluster.yaml'}" in result.stdout
    assert "offered load 0.850 (target 0.85)" in result.stdout
    replay = runner.invoke(
        app,
        [
            "sim",
            str(out / "trace.csv"),
            "-f",
            str(out / "cluster.yaml"),
            "-p",
            "borrowing",
            "-p",
            "default",
            "-o",
            "json",
        ],
    )
    assert replay.exit_code == 0, replay.output
    summaries = json.loads(replay.stdout)
    jobs = len((out / "trace.csv").read_text().splitlines()) - 1
    for summary in summaries:
        assert summary["jobs"] == summary["finished"] == jobs
        assert summary["unfinished"] == 0


def test_json_summary_and_force(tmp_path: Path) -> None:
    out = tmp_path / "w"
    first = synth(out, *SMALL, "-o", "json")
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert data["trace"] == str(out / "trace.csv")
    assert data["offered_load"] == pytest.approx(0.9, rel=0.03)
    assert data["jobs"] == data["gang_jobs"] + data["small_jobs"]
    assert set(data["queues"]) == {"team-a", "team-b", "team-c", "team-d"}
    before = (out / "trace.csv").read_text()
    again = synth(out, *SMALL, "--load", "0.8")
    assert again.exit_code == 1
    assert "not empty" in again.stderr and "--force" in again.stderr
    assert (out / "trace.csv").read_text() == before
    forced = synth(out, *SMALL, "--load", "0.8", "--force")
    assert forced.exit_code == 0, forced.output
    assert (out / "trace.csv").read_text() != before


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--load", "0"], "--load must be more than 0"),
        (["--load", "2.5"], "--load must be more than 0 and at most 2"),
        (["--load", "nan"], "--load"),
        (["--nodes", "1"], "--nodes must be a whole number from 2"),
        (["--queues", "0"], "--queues must be a whole number from 1"),
        (["--days", "0"], "--days must be more than 0"),
        (["--days", "-2"], "--days"),
        (["--gang-share", "1.2"], "--gang-share"),
        (["--nodes", "3", "--queues", "4"], "no queue's quota holds a gang"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path: Path, args: list[str], words: str) -> None:
    out = tmp_path / "w"
    result = synth(out, *args)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and words in line
    assert not out.exists()


def test_out_must_be_a_directory(tmp_path: Path) -> None:
    out = tmp_path / "file"
    out.write_text("x")
    result = synth(out, *SMALL)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "not a directory" in result.stderr
