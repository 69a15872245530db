"""The job state machine: every legal move accepted, every other refused."""

from __future__ import annotations

import itertools

import pytest

from allotment.domain.errors import IllegalTransition
from allotment.domain.lifecycle import (
    ACTIVE,
    ALLOWED,
    TERMINAL,
    WAITING,
    FailureClass,
    JobState,
    transition,
)

S = JobState
F = FailureClass
ENDINGS_WITH_FAILURE = {S.FAILED, S.PREEMPTED, S.CANCELLED, S.RECLAIMED}

LEGAL = sorted((a, b) for a, targets in ALLOWED.items() for b in targets)
ILLEGAL = sorted((a, b) for a, b in itertools.product(JobState, repeat=2) if b not in ALLOWED[a])


def _failure_for(target: JobState) -> FailureClass | None:
    return F.USER_CODE if target is S.FAILED else None


def test_every_state_has_an_entry() -> None:
    assert set(ALLOWED) == set(JobState)


def test_tables_cover_all_pairs() -> None:
    assert len(LEGAL) + len(ILLEGAL) == len(JobState) ** 2
    assert len(LEGAL) == 25


def test_the_documented_lifecycle_is_legal() -> None:
    """The lifecycle: submitted → pending → admitted → starting → running → an ending;
    failed and preempted may go back to pending."""
    chain = [S.SUBMITTED, S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING]
    for a, b in itertools.pairwise(chain):
        assert b in ALLOWED[a]
    for ending in (S.SUCCEEDED, S.FAILED, S.PREEMPTED, S.CANCELLED, S.RECLAIMED):
        assert ending in ALLOWED[S.RUNNING]
    assert S.PENDING in ALLOWED[S.FAILED]
    assert S.PENDING in ALLOWED[S.PREEMPTED]
    assert S.CANCELLED in ALLOWED[S.PREEMPTED]  # cancelled before its requeue
    assert S.CANCELLED not in ALLOWED[S.FAILED]  # a failed job has ended
    assert S.RUNNING not in ALLOWED[S.PENDING]  # nothing skips admission


@pytest.mark.parametrize(("source", "target"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
def test_legal_transition_accepted(source: JobState, target: JobState) -> None:
    event = transition(
        source, target, at=12.5, reason="test", failure=_failure_for(target), detail={"k": 1}
    )
    assert (event.source, event.target) == (source, target)
    assert event.at == 12.5
    assert event.reason == "test"
    assert event.detail == {"k": 1}


@pytest.mark.parametrize(("source", "target"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_illegal_transition_refused(source: JobState, target: JobState) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(source, target, at=0.0, reason="test", failure=_failure_for(target))
    error = info.value
    assert error.code == "illegal_transition"
    assert error.fields == {
        "from": source.value,
        "to": target.value,
        "allowed": sorted(s.value for s in ALLOWED[source]),
    }
    assert f"from {source.value} to {target.value}" in error.message


def test_terminal_states_say_so() -> None:
    assert {S.SUCCEEDED, S.CANCELLED, S.RECLAIMED} == TERMINAL
    with pytest.raises(IllegalTransition, match="terminal"):
        transition(S.SUCCEEDED, S.PENDING, at=0, reason="retry")


def test_state_groups() -> None:
    assert {S.ADMITTED, S.STARTING, S.RUNNING} == ACTIVE
    assert {S.SUBMITTED, S.PENDING} == WAITING
    assert not (ACTIVE & WAITING) and not (ACTIVE & TERMINAL)


def test_strings_are_accepted_for_states() -> None:
    event = transition("running", "succeeded", at=0, reason="exit 0")  # type: ignore[arg-type]
    assert event.target is S.SUCCEEDED
    with pytest.raises(ValueError):
        transition("sleeping", "running", at=0, reason="x")  # type: ignore[arg-type]


def test_retry_paths() -> None:
    assert transition(S.FAILED, S.PENDING, at=0, reason="retry").failure is None
    assert transition(S.PREEMPTED, S.PENDING, at=0, reason="retry").failure is None


@pytest.mark.parametrize(
    ("target", "given", "expected"),
    [
        (S.PREEMPTED, None, F.PREEMPTED),
        (S.PREEMPTED, F.PREEMPTED, F.PREEMPTED),
        (S.CANCELLED, None, F.CANCELLED),
        (S.RECLAIMED, None, F.RECLAIMED),
        (S.FAILED, F.OOM, F.OOM),
        (S.FAILED, F.NODE_FAILURE, F.NODE_FAILURE),
        (S.FAILED, F.TIMEOUT, F.TIMEOUT),
        (S.SUCCEEDED, None, None),
    ],
)
def test_failure_class_rules_accepted(
    target: JobState, given: FailureClass | None, expected: FailureClass | None
) -> None:
    assert transition(S.RUNNING, target, at=0, reason="x", failure=given).failure is expected


@pytest.mark.parametrize(
    ("source", "target", "given", "match"),
    [
        pytest.param(S.RUNNING, S.FAILED, None, "must name", id="failed-without-class"),
        pytest.param(S.RUNNING, S.PREEMPTED, F.OOM, "implies", id="preempted-as-oom"),
        pytest.param(S.RUNNING, S.CANCELLED, F.TIMEOUT, "implies", id="cancelled-as-timeout"),
        pytest.param(S.RUNNING, S.RECLAIMED, F.PREEMPTED, "implies", id="reclaimed-as-preempted"),
        pytest.param(S.RUNNING, S.SUCCEEDED, F.OOM, "no failure", id="succeeded-with-class"),
        pytest.param(S.PENDING, S.ADMITTED, F.OOM, "no failure", id="admitted-with-class"),
        pytest.param(S.FAILED, S.PENDING, F.OOM, "no failure", id="retry-with-class"),
        pytest.param(S.STARTING, S.RUNNING, F.IMAGE, "no failure", id="running-with-class"),
    ],
)
def test_failure_class_rules_refused(
    source: JobState, target: JobState, given: FailureClass | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match) as info:
        transition(source, target, at=0, reason="x", failure=given)
    assert not isinstance(info.value, IllegalTransition)


@pytest.mark.parametrize("target", sorted(ENDINGS_WITH_FAILURE))
def test_every_failure_ending_has_a_class(target: JobState) -> None:
    event = transition(S.RUNNING, target, at=0, reason="x", failure=_failure_for(target))
    assert event.failure is not None
