"""``allot sim --plot DIR``."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from allotment.cli.main import app

runner = CliRunner()
CHARTS = ("utilization.png", "wait_cdf.png", "queue_share.png")


def sim(files: Path, *args: str) -> object:
    return runner.invoke(
        app, ["sim", str(files / "trace.csv"), "-f", str(files / "cluster.yaml"), *args]
    )


def test_plot_writes_the_three_charts(files: Path) -> None:
    charts = files / "out" / "charts"
    result = sim(files, "-p", "fifo-isolated", "-p", "default", "-o", "json", "--plot", str(charts))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("[")
    for name in CHARTS:
        data = (charts / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5_000
        assert f"wrote {charts / name}\n" in result.stderr


def test_plot_into_a_file_is_one_clear_error(files: Path) -> None:
    target = files / "charts.png"
    target.write_text("")
    result = sim(files, "--plot", str(target))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"plot directory {target} is a file, not a directory" in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
