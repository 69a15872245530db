"""Mapping what an executor saw to a failure class (the control loop's reading of it)."""

from __future__ import annotations

import signal

from allotment.domain.lifecycle import FailureClass
from allotment.executors.base import ReplicaPhase, ReplicaStatus


def classify(
    status: ReplicaStatus,
    *,
    timed_out: bool = False,
    preempted: bool = False,
    oom: bool = False,
) -> FailureClass | None:
    """The failure class of an ended replica, or ``None`` for success (exit code 0).

    ``timed_out``, ``preempted`` and ``oom`` add what the caller knows to what the status
    says (the status's own ``timed_out`` and ``oom`` count too). Precedence: preempted
    (we stopped it to preempt) → timeout → image → launch → lost (``node_failure``) → oom
    → exit code or signal (``user_code``). Raises ``ValueError`` for a replica that has not ended.
    """
    if not status.over:
        raise ValueError(f"replica has not ended (phase {status.phase})")
    if preempted:
        return FailureClass.PREEMPTED
    if timed_out or status.timed_out:
        return FailureClass.TIMEOUT
    if status.image_error:
        return FailureClass.IMAGE
    if status.start_error:
        return FailureClass.LAUNCH
    if status.phase is ReplicaPhase.LOST:
        return FailureClass.NODE_FAILURE
    oom = oom or status.oom
    if status.phase is ReplicaPhase.KILLED:
        if oom and status.signal == signal.SIGKILL:
            return FailureClass.OOM
        return FailureClass.USER_CODE
    if status.exit_code == 0:
        return None
    return FailureClass.OOM if oom else FailureClass.USER_CODE


def describe_end(status: ReplicaStatus) -> str:
    """How a replica ended, in words: its signal or exit code, with what the executor
    said of it (e.g. that the command could not be started)."""
    how = (
        f"signal {status.signal}"
        if status.signal is not None
        else f"exit code {status.exit_code}"
        if status.exit_code is not None
        else status.detail or status.phase.value
    )
    if status.detail and status.detail not in how:
        how = f"{how} ({status.detail})"
    return how
