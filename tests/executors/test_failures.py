"""classify(): what an ended replica's status means as a failure class."""

from __future__ import annotations

import signal

import pytest

from allotment.domain.lifecycle import FailureClass
from allotment.executors.base import ReplicaPhase, ReplicaStatus
from allotment.executors.failures import classify

P = ReplicaPhase


def exited(code: int, **kw: bool) -> ReplicaStatus:
    return ReplicaStatus(phase=P.EXITED, exit_code=code, **kw)


def killed(sig: int, **kw: bool) -> ReplicaStatus:
    return ReplicaStatus(phase=P.KILLED, signal=sig, **kw)


CASES = {
    "exit 0 is success": (exited(0), {}, None),
    "non-zero exit is user code": (exited(3), {}, FailureClass.USER_CODE),
    "a crash signal is user code": (killed(signal.SIGSEGV), {}, FailureClass.USER_CODE),
    "SIGKILL with oom is oom": (killed(signal.SIGKILL), {"oom": True}, FailureClass.OOM),
    "SIGKILL recorded as oom": (killed(signal.SIGKILL, oom=True), {}, FailureClass.OOM),
    "plain SIGKILL is user code": (killed(signal.SIGKILL), {}, FailureClass.USER_CODE),
    "allocation failure under a limit": (exited(1, oom=True), {}, FailureClass.OOM),
    "timeout from the caller": (killed(signal.SIGTERM), {"timed_out": True}, FailureClass.TIMEOUT),
    "timeout recorded": (killed(signal.SIGTERM, timed_out=True), {}, FailureClass.TIMEOUT),
    "our preemption stop": (exited(0), {"preempted": True}, FailureClass.PREEMPTED),
    "preemption wins over timeout": (
        killed(signal.SIGKILL),
        {"preempted": True, "timed_out": True},
        FailureClass.PREEMPTED,
    ),
    "lost is node failure": (ReplicaStatus(phase=P.LOST), {}, FailureClass.NODE_FAILURE),
}


@pytest.mark.parametrize(("status", "flags", "expected"), CASES.values(), ids=CASES.keys())
def test_classify(status: ReplicaStatus, flags: dict[str, bool], expected: object) -> None:
    assert classify(status, **flags) is expected


@pytest.mark.parametrize("phase", [P.STARTING, P.RUNNING])
def test_classify_refuses_a_replica_still_running(phase: ReplicaPhase) -> None:
    with pytest.raises(ValueError, match="not ended"):
        classify(ReplicaStatus(phase=phase))
