"""Bad trace files through ``allot sim``: one clear error line naming the file and the
line, exit status 1, nothing on stdout and no traceback.

test_cli_sim.py already covers a non-number submit time, an unknown queue, a bad policy
and a bad time scale; these are the other ways a trace goes wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from allotment.cli.main import app

runner = CliRunner()
HEADER = "job_id,submit_time,duration,queue,gpus"


def sim_error(files: Path, trace: str | bytes) -> str:
    """Run ``allot sim`` on ``trace`` and return its one error line, checking that the
    command failed cleanly."""
    path = files / "trace.csv"
    if isinstance(trace, bytes):
        path.write_bytes(trace)
    else:
        path.write_text(trace)
    result = runner.invoke(app, ["sim", str(path), "-f", str(files / "cluster.yaml")])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize(
    ("trace", "line", "words"),
    [
        pytest.param(
            "job_id,submit_time,queue,gpus\nj1,0,team-a,1\n", 1, ["duration"], id="missing-column"
        ),
        pytest.param(
            f"{HEADER}\nj1,0,10,team-a,1\nj2,5,-3,team-a,1\n",
            3,
            ["duration", "non-negative", "'-3'"],
            id="negative-duration",
        ),
        pytest.param(
            f"{HEADER}\nj1,0,ten,team-a,1\n",
            2,
            ["duration", "number", "'ten'"],
            id="duration-not-a-number",
        ),
        pytest.param(
            f"{HEADER}\nj1,0,10,team-a,1\nj2,0,10,team-a,lots\n",
            3,
            ["'lots'", "gpus"],
            id="gpus-not-a-number",
        ),
        pytest.param(
            f"{HEADER}\nj1,nan,10,team-a,1\n", 2, ["submit_time", "'nan'"], id="nan-submit"
        ),
        pytest.param(
            f"{HEADER}\nj1,0,10,team-a,1\nj2,0,10,team-a,1,x\n",
            3,
            ["6 cells", "header has 5"],
            id="too-many-cells",
        ),
        pytest.param(f"{HEADER}\nj1,0,10,team-a\n", 2, ["too few cells"], id="too-few-cells"),
        pytest.param(
            f"{HEADER}\nj1,0,10,team-a,1\nj1,3,10,team-b,1\n",
            3,
            ["'j1'", "line 2"],
            id="duplicate-job-id",
        ),
        pytest.param(
            f"{HEADER}\nj1,0,10,org,1\n",
            2,
            ["'org'", "leaves", "team-a, team-b"],
            id="inner-queue",
        ),
        pytest.param(
            f"{HEADER},max_runtime\nj1,0,10,team-a,1,soon\n",
            2,
            ["max_runtime"],
            id="bad-max-runtime",
        ),
        pytest.param(
            f"{HEADER},priority_class\nj1,0,10,team-a,1,vip\n",
            2,
            ["'vip'", "team-a"],
            id="unknown-priority-class",
        ),
        pytest.param(
            f"{HEADER},colour\nj1,0,10,team-a,1,red\n", 1, ["colour"], id="unknown-column"
        ),
        pytest.param("", 1, ["empty"], id="empty-file"),
    ],
)
def test_bad_trace_is_one_error_line_naming_file_and_line(
    files: Path, trace: str, line: int, words: list[str]
) -> None:
    message = sim_error(files, trace)
    assert f"{files / 'trace.csv'} line {line}: " in message
    for word in words:
        assert word in message


def test_a_byte_that_is_not_utf8_names_its_line(files: Path) -> None:
    trace = f"{HEADER}\nj1,0,10,team-a,1\nj\xff2,0,10,team-a,1\n".encode("latin-1")
    message = sim_error(files, trace)
    assert f"{files / 'trace.csv'} line 3" in message
