from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from allotment.cli.main import app
from allotment.cli.render import comparison_table
from allotment.scheduler.decisions import Admit, Decisions
from allotment.scheduler.snapshot import ReplicaPlacement, Snapshot
from allotment.sim import replay as replay_module
from allotment.sim.metrics import SUMMARY_FIELDS

runner = CliRunner()


def everything_on_n01(snapshot: Snapshot) -> Decisions:
    """Scripted stand-in for the core: the test trace fits on n01 all at once."""
    admitted = [
        Admit(
            job=p.id,
            queue=p.queue,
            pool="a100",
            placements=(
                ReplicaPlacement(
                    group="worker", index=0, node="n01", resources=dict(p.replicas[0].resources)
                ),
            ),
        )
        for p in snapshot.pending
    ]
    return Decisions(now=snapshot.now, admitted=admitted)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_module, "default_scheduler", lambda: everything_on_n01)


def sim(files: Path, *args: str) -> object:
    return runner.invoke(
        app, ["sim", str(files / "trace.csv"), "-f", str(files / "cluster.yaml"), *args]
    )


def test_sim_compares_policies_in_one_table(files: Path, scripted: None) -> None:
    result = sim(files, "--policy", "fifo-isolated", "--policy", "default", "--per-queue")
    assert result.exit_code == 0, result.output
    assert "fifo-isolated" in result.stdout and "default" in result.stdout
    assert "wait avg" in result.stdout and "team-a" in result.stdout
    assert "GPU-time lost to preemption" in result.stdout
    assert "most restarts of one job" in result.stdout


def test_sim_json_has_the_summary_fields(files: Path, scripted: None) -> None:
    result = sim(files, "-p", "fifo-isolated", "-p", "borrowing+backfill", "-o", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["policy"] for d in data] == ["fifo-isolated", "borrowing+backfill"]
    for summary in data:
        assert list(summary)[: len(SUMMARY_FIELDS) + 1] == ["policy", *SUMMARY_FIELDS]
        assert set(summary["per_queue"]) == {"team-a", "team-b"}
        for stats in summary["per_queue"].values():
            assert set(SUMMARY_FIELDS) <= set(stats)
    assert data[0]["jobs"] == 3
    assert (data[0]["lost_gpu_hours"], data[0]["restarts_max"]) == (0, 0)  # nothing preempted
    assert data[0]["wait_avg_s"] == 0
    assert data[0]["makespan_s"] == 100


def test_jobs_out_one_file_per_policy(files: Path, scripted: None) -> None:
    out = files / "jobs.csv"
    result = sim(files, "--jobs-out", str(out), "--time-scale", "2")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == [
        "job_id",
        "queue",
        "submit_s",
        "start_s",
        "end_s",
        "gpus",
        "nodes",
        "outcome",
    ]
    assert {r["job_id"]: (r["submit_s"], r["nodes"]) for r in rows} == {
        "j1": ("0", "n01:2"),
        "j2": ("20", "n01:1"),
        "j3": ("40", "n01:1"),
    }
    result = sim(files, "--jobs-out", str(out), "-p", "default", "-p", "default+oracle")
    assert result.exit_code == 0, result.output
    assert (files / "jobs.default.csv").is_file()
    assert (files / "jobs.default+oracle.csv").is_file()


def test_sim_with_the_real_core(files: Path) -> None:
    result = sim(files, "-p", "fifo-isolated", "-p", "default", "-o", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["finished"] for d in data] == [3, 3]


@pytest.mark.parametrize(
    ("trace", "args", "message"),
    [
        (
            "job_id,submit_time,duration,queue,gpus\nj1,0,1,team-a,1\nj2,later,1,team-a,1\n",
            [],
            "trace.csv line 3: submit_time must be a number of seconds, got 'later'",
        ),
        (
            "job_id,submit_time,duration,queue,gpus\nj1,0,1,team-q,1\n",
            [],
            "line 2: job j1: unknown queue 'team-q'; queues in the cluster: team-a, team-b",
        ),
        (
            None,
            ["-p", "fastest"],
            "unknown policy 'fastest': 'fastest' is not a preset; known policies: "
            "fifo-isolated, borrowing, fair-share, backfill, default",
        ),
        (None, ["-p", "default", "-p", "default"], "the same policy is given twice"),
        (None, ["--time-scale", "-1"], "--time-scale must be a finite number >= 0"),
    ],
)
def test_sim_errors_are_one_clear_message(
    files: Path, trace: str | None, args: list[str], message: str
) -> None:
    if trace is not None:
        (files / "trace.csv").write_text(trace)
    result = sim(files, *args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_sim_missing_files(files: Path) -> None:
    result = runner.invoke(
        app, ["sim", str(files / "absent.csv"), "-f", str(files / "cluster.yaml")]
    )
    assert result.exit_code == 1
    assert "absent.csv: no such file" in result.stderr
    result = runner.invoke(app, ["sim", str(files / "trace.csv"), "-f", str(files / "no.yaml")])
    assert result.exit_code == 1
    assert "no.yaml: no such file" in result.stderr


def test_sim_without_cluster_file_uses_the_one_here(
    files: Path, scripted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(files)
    assert runner.invoke(app, ["sim", "trace.csv", "-o", "json"]).exit_code == 0
    (files / "cluster.yaml").unlink()
    result = runner.invoke(app, ["sim", "trace.csv"])
    assert result.exit_code == 1
    assert "no cluster file: give -f cluster.yaml" in result.stderr


def test_jittered_replay_names_its_seed(files: Path) -> None:
    result = sim(files, "-p", "default", "--jitter-seed", "3", "-o", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data[0]["jitter_seed"] == 3 and data[0]["finished"] == 3
    plain = json.loads(sim(files, "-p", "default", "-o", "json").stdout)
    assert "jitter_seed" not in plain[0]
    result = sim(files, "-p", "default", "--jitter-seed", "3")
    assert result.exit_code == 0 and "jittered (seed 3)" in " ".join(result.stdout.split())
    result = sim(files, "--jitter-seed", "-1")
    assert result.exit_code != 0 and "--jitter-seed" in result.output


def test_the_table_says_when_a_replay_cut_an_instant_short() -> None:
    """A replay that reached its livelock guard is not faithful: the table says so (and
    says nothing of it otherwise)."""

    def shown(*cut: int) -> str:
        console = Console(width=200, record=True)
        summaries = [{"policy": f"p{i}", "instants_cut": n} for i, n in enumerate(cut)]
        console.print(comparison_table(summaries, "t"))
        return console.export_text()

    assert "instants cut short" not in shown(0, 0)
    row = next(line for line in shown(0, 3).splitlines() if "instants cut short" in line)
    assert [cell.strip() for cell in row.split("│")[2:4]] == ["0", "3"]
