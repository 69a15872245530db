from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from allotment.domain.errors import AlreadyEnded, IllegalTransition, NotFound
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.domain.reasons import Reason, ReasonCode
from allotment.store.jobs import (
    cancel_job,
    create_job,
    events_for,
    get_job,
    jobs_by_id,
    jobs_in_groups,
    list_jobs,
    record_reason,
    record_reasons,
    requeue_job,
    transition_job,
)
from allotment.store.models import Event, Job
from allotment.store.views import last_event_id

S = JobState
T0 = 1_700_000_000.0


def spec(name: str = "train", queue: str = "research", **extra: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "queue": queue,
            "priority_class": "normal",
            "replicas": [{"name": "worker", "count": 2, "resources": {"gpu": 8}}],
            **extra,
        }
    )


def submit(sessions: sessionmaker[Session], job_id: str, at: float = T0, **kw: Any) -> None:
    with sessions.begin() as session:
        create_job(session, spec(**kw), tenant="acme", user="ada", at=at, job_id=job_id)


def move(sessions: sessionmaker[Session], job_id: str, to: JobState, at: float, **kw: Any) -> None:
    with sessions.begin() as session:
        transition_job(session, job_id, to, at=at, message=f"to {to.value}", **kw)


def test_create_writes_submitted_and_its_event(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "j-000001")
    with sessions() as session:
        job = get_job(session, "j-000001")
        assert (job.state, job.queue, job.tenant, job.user) == (
            "submitted",
            "research",
            "acme",
            "ada",
        )
        assert (job.priority_class, job.type, job.attempt) == ("normal", "training", 0)
        assert JobSpec.model_validate(job.spec) == spec()
        events = events_for(session, "j-000001")
        assert [(e.kind, e.from_state, e.to_state, e.at) for e in events] == [
            ("transition", None, "submitted", T0)
        ]


def test_created_job_is_the_sessions_row_and_can_move_in_the_same_transaction(
    sessions: sessionmaker[Session],
) -> None:
    with sessions.begin() as session:
        job = create_job(
            session, spec(), tenant="acme", user="ada", at=T0, job_id="j-1", accepted="ok"
        )
        assert job in session and job not in session.dirty
        assert session.get(Job, "j-1") is job
        assert (job.state, job.reason_code, job.reason_detail) == ("pending", None, None)
        transition_job(session, "j-1", S.CANCELLED, at=T0 + 1, message="bye", job=job)
    with sessions() as session:
        assert get_job(session, "j-1").state == "cancelled"
        reason_detail = session.scalar(select(Job.reason_detail).where(Job.id == "j-1"))
        assert reason_detail is None
        assert [e.to_state for e in events_for(session, "j-1")] == [
            "submitted",
            "pending",
            "cancelled",
        ]


def test_lifecycle_writes_one_event_per_transition(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "j-1")
    path = [S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING, S.PREEMPTED, S.PENDING]
    path += [S.ADMITTED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    for i, state in enumerate(path, start=1):
        move(sessions, "j-1", state, T0 + i, detail={"step": i})
    with sessions() as session:
        job = get_job(session, "j-1")
        assert job.state == "succeeded"
        assert job.failure_class is None
        assert job.updated_at == T0 + len(path)
        events = events_for(session, "j-1")
        moves = [(e.from_state, e.to_state) for e in events[1:]]
        expected = list(zip(["submitted", *path[:-1]], path, strict=True))
        assert moves == [(str(a), str(b)) for a, b in expected]
        assert [e.detail.get("step") for e in events[1:]] == list(range(1, len(path) + 1))
        preempted = events[5]
        assert preempted.to_state == "preempted"
        assert preempted.detail["failure_class"] == "preempted"


def test_failure_class_is_kept_on_the_row(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "j-1")
    for i, state in enumerate([S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING], start=1):
        move(sessions, "j-1", state, T0 + i)
    move(sessions, "j-1", S.FAILED, T0 + 9, failure_class=FailureClass.OOM)
    with sessions() as session:
        assert get_job(session, "j-1").failure_class == "oom"
    move(sessions, "j-1", S.PENDING, T0 + 10)
    with sessions() as session:
        assert get_job(session, "j-1").failure_class is None


def _snapshot(session: Session, job_id: str) -> tuple[Any, ...]:
    job = get_job(session, job_id)
    count = session.scalar(select(func.count()).select_from(Event))
    return (job.state, job.failure_class, job.updated_at, count)


@pytest.mark.parametrize(
    ("to", "kw", "error"),
    [
        (S.RUNNING, {}, IllegalTransition),
        (S.SUCCEEDED, {}, IllegalTransition),
        (S.FAILED, {}, ValueError),
        (S.CANCELLED, {"failure_class": FailureClass.OOM}, ValueError),
    ],
)
def test_illegal_transition_raises_and_writes_nothing(
    sessions: sessionmaker[Session], to: JobState, kw: dict[str, Any], error: type[Exception]
) -> None:
    submit(sessions, "j-1")
    move(sessions, "j-1", S.PENDING, T0 + 1)
    with sessions() as session:
        before = _snapshot(session, "j-1")
    with pytest.raises(error), sessions.begin() as session:
        transition_job(session, "j-1", to, at=T0 + 2, message="nope", **kw)
    with sessions() as session:
        assert _snapshot(session, "j-1") == before


def test_illegal_transition_leaves_the_open_transaction_clean(
    sessions: sessionmaker[Session],
) -> None:
    submit(sessions, "j-1")
    with sessions.begin() as session:
        with pytest.raises(IllegalTransition):
            transition_job(session, "j-1", S.RUNNING, at=T0 + 1, message="nope")
        assert not session.new and not session.dirty
        transition_job(session, "j-1", S.PENDING, at=T0 + 2, message="queued")
    with sessions() as session:
        assert [e.to_state for e in events_for(session, "j-1")] == ["submitted", "pending"]


def test_terminal_state_cannot_be_left(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "j-1")
    move(sessions, "j-1", S.CANCELLED, T0 + 1)
    with pytest.raises(IllegalTransition) as info, sessions.begin() as session:
        transition_job(session, "j-1", S.PENDING, at=T0 + 2, message="revive")
    assert info.value.fields == {"from": "cancelled", "to": "pending", "allowed": []}


def test_unknown_job_is_not_found(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        with pytest.raises(NotFound):
            get_job(session, "j-missing")
        with pytest.raises(NotFound):
            transition_job(session, "j-missing", S.PENDING, at=T0, message="x")
        assert events_for(session, "j-missing") == []


def test_list_filters_in_the_query_and_pages(sessions: sessionmaker[Session]) -> None:
    for i in range(6):
        submit(sessions, f"j-{i}", at=T0 + i, queue="research" if i % 2 else "prod")
    move(sessions, "j-1", S.PENDING, T0 + 10)
    move(sessions, "j-2", S.PENDING, T0 + 10)
    move(sessions, "j-3", S.CANCELLED, T0 + 10)
    with sessions() as session:

        def ids(**kw: Any) -> list[str]:
            return [j.id for j in list_jobs(session, **kw)]

        assert ids() == [f"j-{i}" for i in range(6)]
        assert ids(queue="research") == ["j-1", "j-3", "j-5"]
        assert ids(states=[S.PENDING]) == ["j-1", "j-2"]
        assert ids(queue="research", states=[S.SUBMITTED, S.PENDING]) == ["j-1", "j-5"]
        assert ids(states=[]) == []
        assert ids(tenant="other") == []
        assert ids(limit=2) == ["j-0", "j-1"]
        assert ids(limit=2, after="j-1") == ["j-2", "j-3"]
        assert ids(limit=2, after="j-5") == []
        with pytest.raises(ValueError):
            ids(limit=0)


def test_groups_of_states_are_read_at_once(engine: Engine, sessions: sessionmaker[Session]) -> None:
    for i in range(5):
        submit(sessions, f"j-{i}", at=T0 + i, queue="research" if i % 2 else "prod")
    for name in ("j-0", "j-1", "j-2", "j-3"):
        move(sessions, name, S.PENDING, T0 + 10)
    move(sessions, "j-1", S.ADMITTED, T0 + 11)
    move(sessions, "j-3", S.ADMITTED, T0 + 11)
    waiting, active = [S.SUBMITTED, S.PENDING], [S.ADMITTED, S.STARTING, S.RUNNING]

    def ids(groups: list[list[JobState]], **kw: Any) -> list[list[str]]:
        with sessions() as session:
            return [[j.id for j in group] for group in jobs_in_groups(session, groups, **kw)]

    assert ids([active, waiting]) == [["j-1", "j-3"], ["j-0", "j-2", "j-4"]]
    assert ids([active, waiting], limit=2) == [["j-1", "j-3"], ["j-0", "j-2"]]
    assert ids([active, waiting], tenant="other") == [[], []]
    assert ids([]) == []
    with pytest.raises(ValueError):
        ids([active], limit=0)

    # j-2 is admitted (by another connection) right after the first statement that
    # reads jobs: a query per group misses it, the one read finds it where it was.
    def admit_once(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and not admitted:
            admitted.append(True)
            move(sessions, "j-2", S.ADMITTED, T0 + 20)

    admitted: list[bool] = []
    event.listen(engine, "after_cursor_execute", admit_once)
    try:
        with sessions() as session:
            running = [j.id for j in list_jobs(session, states=active)]
            queued = [j.id for j in list_jobs(session, states=waiting)]
        assert "j-2" not in running + queued  # what the overview did
        move(sessions, "j-2", S.PENDING, T0 + 30)
        admitted.clear()
        assert ids([active, waiting]) == [["j-1", "j-3"], ["j-0", "j-2", "j-4"]]
        assert admitted  # it was admitted meanwhile
    finally:
        event.remove(engine, "after_cursor_execute", admit_once)
    assert ids([active, waiting]) == [["j-1", "j-2", "j-3"], ["j-0", "j-4"]]


def test_page_ties_on_submit_time_break_by_id(sessions: sessionmaker[Session]) -> None:
    for name in ["j-b", "j-a", "j-c"]:
        submit(sessions, name, at=T0)
    with sessions() as session:
        assert [j.id for j in list_jobs(session, after="j-a")] == ["j-b", "j-c"]


def test_record_reason_writes_only_changes(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "j-1")
    quota = Reason(ReasonCode.QUOTA_EXHAUSTED, "queue research has no gpu left", {"gpu": 0})
    nofit = Reason(ReasonCode.NO_NODE_FITS, "no node has 8 free gpus")
    results = []
    for i, reason in enumerate([quota, quota, nofit, nofit, quota], start=1):
        with sessions.begin() as session:
            results.append(record_reason(session, "j-1", reason, at=T0 + i))
    assert results == [True, False, True, False, True]
    with sessions() as session:
        job = get_job(session, "j-1")
        assert (job.reason_code, job.reason_message) == ("quota_exhausted", quota.message)
        assert (job.reason_detail, job.reason_since) == ({"gpu": 0}, T0 + 5)
        reasons = [e for e in events_for(session, "j-1") if e.kind == "reason"]
        assert [(e.at, e.detail["code"]) for e in reasons] == [
            (T0 + 1, "quota_exhausted"),
            (T0 + 3, "no_node_fits"),
            (T0 + 5, "quota_exhausted"),
        ]


def test_record_reasons_writes_only_changes_and_skips_unknown_jobs(
    sessions: sessionmaker[Session],
) -> None:
    for job_id in ("j-1", "j-2", "j-3"):
        submit(sessions, job_id)
    quota = Reason(ReasonCode.QUOTA_EXHAUSTED, "queue research has no gpu left", {"gpu": 0})
    nofit = Reason(ReasonCode.NO_NODE_FITS, "no node has 8 free gpus")
    with sessions.begin() as session:
        record_reason(session, "j-1", quota, at=T0)
    with sessions.begin() as session:
        changed = record_reasons(
            session, {"j-1": quota, "j-2": nofit, "j-3": quota, "j-x": quota}, at=T0 + 1
        )
    assert sorted(changed) == ["j-2", "j-3"]
    with sessions.begin() as session:
        assert record_reasons(session, {"j-2": nofit, "j-3": nofit}, at=T0 + 2) == ["j-3"]
    move(sessions, "j-1", S.PENDING, T0 + 3)
    with sessions.begin() as session:  # only pending jobs: j-2 (submitted) is skipped
        only = record_reasons(session, {"j-1": nofit, "j-2": quota}, at=T0 + 3, states=[S.PENDING])
        assert only == ["j-1"]
    with sessions() as session:
        j1 = get_job(session, "j-1")
        assert (j1.reason_code, j1.reason_since) == ("no_node_fits", T0 + 3)
        j2 = get_job(session, "j-2")
        assert (j2.reason_code, j2.reason_since) == ("no_node_fits", T0 + 1)
        j3 = get_job(session, "j-3")
        assert (j3.reason_code, j3.reason_message, j3.reason_since) == (
            "no_node_fits",
            nofit.message,
            T0 + 2,
        )
        codes = [e.detail["code"] for e in events_for(session, "j-3") if e.kind == "reason"]
        assert codes == ["quota_exhausted", "no_node_fits"]


def test_record_reasons_over_many_chunks(sessions: sessionmaker[Session]) -> None:
    ids = [f"j-{i:04d}" for i in range(1_203)]
    with sessions.begin() as session:
        for i, job_id in enumerate(ids):
            create_job(session, spec(), tenant="acme", user="ada", at=T0 + i, job_id=job_id)
    reason = Reason(ReasonCode.QUOTA_EXHAUSTED, "full")
    with sessions.begin() as session:
        assert len(record_reasons(session, dict.fromkeys(ids, reason), at=T0)) == len(ids)
    with sessions() as session:
        count = session.scalar(
            select(func.count()).select_from(Event).where(Event.kind == "reason")
        )
        assert count == len(ids)
        rows = jobs_by_id(session, [*reversed(ids), "j-unknown"])
        assert [job.id for job in rows] == ids  # submission order, unknown ones skipped
        assert jobs_by_id(session, []) == []


def test_two_sessions_update_different_jobs(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "j-1")
    submit(sessions, "j-2")
    first, second = sessions(), sessions()
    try:
        first.begin()
        second.begin()
        transition_job(first, "j-1", S.PENDING, at=T0 + 1, message="one")
        # SQLite serialises writers: the second waits (busy timeout) for the first commit.
        first.commit()
        transition_job(second, "j-2", S.CANCELLED, at=T0 + 2, message="two")
        second.commit()
    finally:
        first.close()
        second.close()
    with sessions() as session:
        assert get_job(session, "j-1").state == "pending"
        assert get_job(session, "j-2").state == "cancelled"
        assert len(events_for(session, "j-1")) == 2
        assert len(events_for(session, "j-2")) == 2


@pytest.mark.parametrize(
    "path",
    [
        [S.PENDING],
        [S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING],
        [S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING, S.PREEMPTED],
    ],
    ids=["pending", "running", "preempted"],
)
def test_cancel_moves_a_live_job_to_cancelled(
    sessions: sessionmaker[Session], path: list[JobState]
) -> None:
    submit(sessions, "j-1")
    for i, state in enumerate(path, start=1):
        move(sessions, "j-1", state, T0 + i)
    with sessions.begin() as session:
        job = cancel_job(session, "j-1", at=T0 + 50, by="ada")
        assert (job.state, job.failure_class) == ("cancelled", "cancelled")
    with sessions() as session:
        last = events_for(session, "j-1")[-1]
        assert (last.from_state, last.to_state, last.message) == (
            path[-1].value,
            "cancelled",
            "cancelled by ada",
        )
        assert last.detail["by"] == "ada"


@pytest.mark.parametrize(
    ("ending", "kw"),
    [
        (S.SUCCEEDED, {}),
        (S.FAILED, {"failure_class": FailureClass.USER_CODE}),
        (S.CANCELLED, {}),
    ],
)
def test_cancel_of_an_ended_job_is_a_conflict_that_writes_nothing(
    sessions: sessionmaker[Session], ending: JobState, kw: dict[str, Any]
) -> None:
    submit(sessions, "j-1")
    for i, state in enumerate([S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING], start=1):
        move(sessions, "j-1", state, T0 + i)
    move(sessions, "j-1", ending, T0 + 9, **kw)
    with sessions() as session:
        before = _snapshot(session, "j-1")
    with pytest.raises(AlreadyEnded) as info, sessions.begin() as session:
        cancel_job(session, "j-1", at=T0 + 10)
    assert info.value.code == "already_ended"
    assert info.value.fields == {"job": "j-1", "state": ending.value, "action": "cancel"}
    with sessions() as session:
        assert _snapshot(session, "j-1") == before


def test_cancel_of_an_unknown_job_is_not_found(sessions: sessionmaker[Session]) -> None:
    with pytest.raises(NotFound), sessions.begin() as session:
        cancel_job(session, "j-missing", at=T0)


def test_requeue_sets_not_before_with_the_move(sessions: sessionmaker[Session]) -> None:
    submit(sessions, "j-1")
    for i, state in enumerate([S.PENDING, S.ADMITTED, S.STARTING, S.RUNNING], start=1):
        move(sessions, "j-1", state, T0 + i)
    move(sessions, "j-1", S.FAILED, T0 + 5, failure_class=FailureClass.NODE_FAILURE)
    with sessions.begin() as session:
        requeue_job(session, "j-1", at=T0 + 6, not_before=T0 + 36, message="retry 1 of 2")
    with sessions() as session:
        job = get_job(session, "j-1")
        assert (job.state, job.failure_class, job.not_before) == ("pending", None, T0 + 36)
        assert events_for(session, "j-1")[-1].message == "retry 1 of 2"


def test_transition_of_a_row_the_caller_holds(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as session:
        job = create_job(session, spec(), tenant="acme", user="ada", at=T0, job_id="j-1")
        moved = transition_job(session, "j-1", S.PENDING, at=T0 + 1, message="ok", job=job)
        assert moved is job
        with pytest.raises(IllegalTransition):
            transition_job(session, "j-1", S.RUNNING, at=T0 + 2, message="no", job=job)
    with sessions() as session:
        assert get_job(session, "j-1").state == "pending"
        assert [e.to_state for e in events_for(session, "j-1")] == ["submitted", "pending"]


def test_a_job_that_stops_waiting_drops_its_reason_and_gets_a_new_one_when_requeued(
    sessions: sessionmaker[Session],
) -> None:
    submit(sessions, "j-1")
    move(sessions, "j-1", JobState.PENDING, T0)
    with sessions.begin() as session:
        record_reason(session, "j-1", Reason(ReasonCode.NO_NODE_FITS, "no room"), at=T0 + 1)
        transition_job(session, "j-1", JobState.ADMITTED, at=T0 + 2, message="admitted")
    with sessions() as session:
        job = get_job(session, "j-1")
        assert (job.reason_code, job.reason_message, job.reason_since) == (None, None, None)
        assert job.reason_detail is None
    with sessions.begin() as session:
        transition_job(session, "j-1", JobState.PENDING, at=T0 + 3, message="withdrawn")
        assert record_reason(session, "j-1", Reason(ReasonCode.NO_NODE_FITS, "no room"), at=T0 + 4)
    with sessions() as session:
        assert get_job(session, "j-1").reason_since == T0 + 4


def test_last_event_id_moves_with_every_job_written(sessions: sessionmaker[Session]) -> None:
    marks = []
    with sessions() as session:
        marks.append(last_event_id(session))
    submit(sessions, "j-1")
    with sessions() as session:
        marks.append(last_event_id(session))
    with sessions.begin() as session:
        reason = Reason(ReasonCode.QUOTA_EXHAUSTED, "queue research has no gpu left")
        record_reason(session, "j-1", reason, at=T0 + 1)
    with sessions() as session:
        marks.append(last_event_id(session))
    move(sessions, "j-1", S.PENDING, T0 + 2)
    with sessions() as session:
        marks.append(last_event_id(session))
    assert marks[0] == 0 and marks == sorted(set(marks))  # each write moved it on
