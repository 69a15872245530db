"""The loop-alone bench on a tiny share of the Kueue baseline: every job stored through
the service ends succeeded and the figures are printed (behaviour only; no figure is
checked); a share out of range is a usage error."""

from __future__ import annotations

import json

import pytest
from bench.bench_loop import main


def test_every_job_succeeds_and_the_figures_are_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--share", "0.01"]) == 0
    title, header, row = capsys.readouterr().out.splitlines()
    assert title.startswith("loop alone: 180 jobs (--share 0.01), sqlite")
    assert header.split() == [
        *("run", "jobs", "turns", "wall", "s", "CPU", "s", "CPU", "ms/turn", "p50"),
        *("mean", "preemptions"),
    ]
    label, jobs, turns, wall_s, cpu_s, p50, mean, preemptions = row.split()
    assert (label, jobs, int(turns) > 0, int(preemptions) >= 0) == ("1", "180", True, True)
    assert all(float(x) > 0 for x in (wall_s, cpu_s, p50, mean))


def test_json_holds_each_run_and_the_median(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--share", "0.005", "--repeat", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 2 and out["jobs"] == 120
    for figures in (*out["runs"], out):
        assert figures["states"] == {"succeeded": 120} and figures["turns"] > 0
        assert figures["cpu_ms_p50"] > 0 and figures["cpu_ms_mean"] > 0


@pytest.mark.parametrize("argv", [["--share", "0"], ["--share", "1.5"], ["--repeat", "0"]])
def test_arguments_out_of_range_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:") and "Traceback" not in err
