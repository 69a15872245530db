"""The replay-speed bench on the first jobs of the Philly window: a row per load and
preset, every job finished, and (behaviour only; no time is checked) borrowing idle
quota waits less than strict FIFO per VC once the load is compressed."""

from __future__ import annotations

import pytest
from bench.bench_replay import main


def test_every_preset_at_every_load_gets_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    rows = main(["--first", "2000", "--loads", "4", "8", "--presets", "fifo-isolated", "default"])
    assert [(r["load"], r["policy"]) for r in rows] == [
        (4.0, "fifo-isolated"),
        (4.0, "default"),
        (8.0, "fifo-isolated"),
        (8.0, "default"),
    ]
    for row in rows:
        assert row["finished"] == 2000 and row["unfinished"] == 0
        assert row["cpu_s"] > 0 and row["cycles"] > 0
    fifo, default = rows[2], rows[3]
    assert default["wait_avg_s"] < fifo["wait_avg_s"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:2] == ["load", "preset"]
    assert len(printed) == 5 and all("target" in line or "met" in line for line in printed)


def test_a_load_must_be_positive_and_a_preset_known(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--loads", "0"])
    with pytest.raises(SystemExit):
        main(["--presets", "nope"])
    assert "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--trace", "no-such-trace.csv"])
    assert "no-such-trace.csv" in capsys.readouterr().err
