"""Recorded history: the jobs of a window as they really went, read from the store for
``allot whatif`` and ``allot history export``.

A job's *runs* are its allocations: from the instant the scheduler admitted it (its GPUs
were taken) to the instant the control loop released them (it saw the job end). That is
what a replay must reproduce, so it is measured from the state moves, not from when the
job's processes started and exited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRun:
    """One allocation of a recorded job."""

    admitted: float
    """When the scheduler admitted it (seconds since the epoch)."""
    released: float | None
    """When its resources were released; None: still held at the window's end."""
    ended_as: str | None
    """The state it ended in (``succeeded``, ``failed``, ``preempted``, ``cancelled``,
    ``reclaimed``); None while open."""
    exited: float | None = None
    """When its last process ended, as the executor reported (None: not known)."""
    stopped: float | None = None
    """For a run ended ``preempted``: when its processes had stopped and it was back in
    line (its resources were held until then)."""
    failure_class: str | None = None
    pool: str | None = None
    borrowed_gpus: int = 0
    """Milli-GPUs of it that were borrowed beyond its queue's nominal quota."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedJob:
    """A job submitted before the window's end that had not ended before its start."""

    id: str
    tenant: str
    queue: str
    priority_class: str
    type: str
    submit_time: float
    spec: Mapping[str, Any]
    """The job file as submitted (the store's JSON form of the spec)."""
    state: str
    """Its state at the window's end (as far as the store knew)."""
    runs: tuple[RecordedRun, ...] = ()
    withdrawn: float | None = None
    """When it was cancelled while waiting (never admitted since), if it was."""
    user: str = ""
    """Who submitted it (empty where not read)."""

    @property
    def first_admitted(self) -> float | None:
        return self.runs[0].admitted if self.runs else None


@dataclass(frozen=True, slots=True)
class ConfigVersion:
    """One applied version of the cluster file."""

    version: int
    applied_at: float
    text: str


def spec_seconds(value: object) -> float | None:
    """A duration of a stored job spec (``max_runtime``, ``expected_runtime``: the store
    keeps them as seconds): None when it has none."""
    return float(value) if isinstance(value, int | float) and value > 0 else None
