"""``--jobs-out``: one CSV row per job attempt (see the README).

Columns ``job_id,queue,submit_s,start_s,end_s,gpus,nodes,outcome``: times in replay
seconds (empty when the attempt never started or never ended), ``gpus`` the attempt's
total in GPUs, ``nodes`` its ``node:gpus`` pairs joined by ``;``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from allotment.domain.errors import InvalidInput
from allotment.domain.resources import MILLI
from allotment.sim.results import Attempt

COLUMNS = ("job_id", "queue", "submit_s", "start_s", "end_s", "gpus", "nodes", "outcome")


def format_seconds(value: float | None) -> str:
    """``12`` for whole seconds, else at most three decimals; empty for None."""
    if value is None:
        return ""
    rounded = round(value, 3)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.3f}".rstrip("0")


def format_gpus(milli: int) -> str:
    """Milli-GPUs as GPUs: ``8``, ``0.5``."""
    if milli % MILLI == 0:
        return str(milli // MILLI)
    return f"{milli / MILLI:.3f}".rstrip("0")


def write_attempts(attempts: Iterable[Attempt], out: TextIO) -> int:
    """Write the header and one row per attempt to ``out``; return the number of rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    rows = 0
    for a in attempts:
        writer.writerow(
            (
                a.job_id,
                a.queue,
                format_seconds(a.submit),
                format_seconds(a.start),
                format_seconds(a.end),
                format_gpus(a.gpus),
                ";".join(f"{node}:{format_gpus(gpus)}" for node, gpus in a.nodes),
                a.outcome,
            )
        )
        rows += 1
    return rows


def write_jobs_out(attempts: Iterable[Attempt], path: str | Path) -> int:
    """Write ``attempts`` to the CSV file ``path``; return the number of rows."""
    try:
        with Path(path).open("w", newline="", encoding="utf-8") as handle:
            return write_attempts(attempts, handle)
    except OSError as exc:
        raise InvalidInput(
            f"cannot write {path}: {exc.strerror or exc}", fields={"path": str(path)}
        ) from exc
