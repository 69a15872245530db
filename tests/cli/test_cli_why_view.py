"""`allot why` never promises a start it cannot give: a job that can never fit the
cluster as it is says so, instead of blaming another job's runtime, and a start guessed
from history says it is a guess."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from allotment.cli.live_render import why_view


def shown(data: dict[str, Any]) -> str:
    console = Console(record=True, width=200)
    console.print(why_view(data))
    return console.export_text()


def why(reason: dict[str, Any]) -> dict[str, Any]:
    return {"job": "j-1", "state": "pending", "reason": reason, "estimated_start": None}


def test_a_job_that_can_never_fit_has_no_start_to_wait_for() -> None:
    text = shown(
        why(
            {
                "code": "no_node_fits",
                "message": "pool(s) a could not hold this job even when empty",
                "detail": {"pools": ["a"], "permanent": True},
            }
        )
    )
    assert "estimated start: none: it cannot run on this cluster as it is" in text
    assert "no runtime" not in text


def test_a_job_behind_one_without_a_runtime_says_so() -> None:
    text = shown(why({"code": "no_node_fits", "message": "busy", "detail": {}}))
    assert (
        "estimated start: unknown (a job it waits for has no runtime, and too few like it "
        "have finished here to guess one)"
    ) in text


def test_a_start_guessed_from_history_says_so_and_a_declared_one_stands_alone() -> None:
    data = why({"code": "no_node_fits", "message": "busy", "detail": {}})
    data.update(estimated_start="2026-12-01T10:20:00Z", estimate_basis="history")
    text = shown(data)
    assert (
        "estimated start: 2026-12-01T10:20:00Z (guessed from the run times of jobs that "
        "finished here)"
    ) in text
    data.update(estimate_basis="declared")
    assert "estimated start: 2026-12-01T10:20:00Z\n" in shown(data)
