"""The noise bench on a small synthetic trace: one row per preset over the trace as given
and its jittered copies, with consistent figures; bad arguments are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.bench_noise import main

from allotment.sim.synthetic import GangHeavy, cluster_yaml, gang_heavy, trace_csv


@pytest.fixture
def synth(tmp_path: Path) -> Path:
    workload = gang_heavy(GangHeavy(load=0.95, seed=3, nodes=8, days=0.5))
    (tmp_path / "trace.csv").write_text(trace_csv(workload))
    (tmp_path / "cluster.yaml").write_text(cluster_yaml(workload))
    return tmp_path


def test_a_row_per_preset_over_every_copy(synth: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, cluster = str(synth / "trace.csv"), str(synth / "cluster.yaml")
    rows = main([trace, "-f", cluster, "--copies", "2", "--presets", "borrowing", "default"])
    assert [(r["preset"], r["copies"]) for r in rows] == [("borrowing", 3), ("default", 3)]
    for row in rows:
        for figure in ("wait_avg_s", "jct_avg_s", "guarantee_violations"):
            got = row[figure]
            assert got["low"] <= got["as_given"] <= got["high"]
            assert got["low"] <= got["mean"] <= got["high"]
        assert row["jct_avg_s"]["low"] > 0
    for figure in ("wait_avg_s", "jct_avg_s"):
        ratios = [r[figure]["to_best"] for r in rows]
        assert min(ratios) == 1.0 and all(r >= 1.0 for r in ratios)
    printed = capsys.readouterr().out.splitlines()
    assert "2 jittered copies" in printed[0]
    assert [line.split()[0] for line in printed[2:]] == ["borrowing", "default"]


def test_bad_arguments_are_refused(synth: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, cluster = str(synth / "trace.csv"), str(synth / "cluster.yaml")
    with pytest.raises(SystemExit):
        main([trace, "-f", cluster, "--copies", "0"])
    with pytest.raises(SystemExit):
        main([trace, "-f", cluster, "--presets", "nope"])
    assert "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(synth / "absent.csv"), "-f", cluster])
    assert "absent.csv: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([trace, "-f", str(synth / "absent.yaml")])
    assert "absent.yaml: no such file" in capsys.readouterr().err
    for bad in (["--workers", "0"], ["--time-scale", "-1"], ["--time-scale", "inf"]):
        with pytest.raises(SystemExit):
            main([trace, "-f", cluster, *bad])
        assert bad[0] in capsys.readouterr().err
