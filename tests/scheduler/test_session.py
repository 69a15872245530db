"""The incremental scheduler (:class:`Session`) against the reference, ``schedule_once``.

1. A session built from a snapshot decides exactly what ``schedule_once`` decides.
2. After any sequence of submissions, cycles, completions, cancellations and
   preemptions, the state a session keeps (free capacity per node and device, quota
   usage and demand, each queue's order) equals the state rebuilt from its snapshot,
   and its decisions keep every invariant the reference keeps.
"""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allotment.scheduler import cycle as cycle_module
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.lines import Line, group_lines
from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import PendingJob, SchedulerPolicy, Snapshot
from allotment.scheduler.state import CycleState
from tests.scheduler.builders import NOW, ClusterBuilder, job, patches_core, running
from tests.scheduler.test_properties import (
    Limits,
    World,
    check_gangs,
    check_no_overcommit,
    check_outcomes,
    check_quota,
    check_victims,
    job_streams,
    worlds,
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(worlds())
def test_a_session_decides_what_schedule_once_decides(world: World) -> None:
    snapshot = world.snapshot()
    expected = schedule_once(snapshot)
    got = Session.from_snapshot(snapshot).cycle(snapshot.now)
    assert got == expected


def _nonzero(amounts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in amounts.items() if v}


def assert_same_state(session: Session) -> None:
    """What the session keeps equals what a snapshot rebuilds."""
    snapshot = session.snapshot()
    fresh = CycleState.from_snapshot(snapshot)
    kept = session.state
    assert set(kept.holders) == set(fresh.holders)
    for name, node in fresh.placer.nodes.items():
        mine = kept.placer.nodes[name]
        assert _nonzero(mine.free) == _nonzero(node.free), name
        assert mine.device_free == node.device_free, name
        assert mine.whole_free == node.whole_free, name
    for key, usage in fresh.quota._usage.items():
        assert _nonzero(kept.quota._usage[key]) == _nonzero(usage), key
    for key, demand in fresh.quota._demand.items():
        assert _nonzero(kept.quota._demand[key]) == _nonzero(demand), key
    # The classes held per (pool, queue), which victim searches look at first.
    assert {k: v for k, v in kept.classes.items() if v} == {
        k: v for k, v in fresh.classes.items() if v
    }
    # The victim searches' index: every holder under its pool and queue, and no other.
    grouped: dict[tuple[str, str], set[str]] = {}
    for holder in kept.holders.values():
        grouped.setdefault((holder.pool, holder.queue), set()).add(holder.id)
    assert {
        (pool, queue): set(group)
        for pool, groups in kept.by_queue.items()
        for queue, group in groups.items()
        if group
    } == grouped
    # How many holders of each pool have a known end (backfill plans skip pools with none).
    counted: dict[str, int] = {}
    for holder in kept.holders.values():
        if holder.end_bound is not None:
            counted[holder.pool] = counted.get(holder.pool, 0) + 1
    assert {pool: n for pool, n in kept.known_end.items() if n} == counted
    assert {pool: n for pool, n in fresh.known_end.items() if n} == counted
    classes = {name: c.value for name, c in session.cluster.priority_classes.items()}
    lines, _ = group_lines(snapshot.pending, classes)
    for queue, line in lines.items():
        assert [j.id for j in session.line(queue)] == line.ids, queue


def check_all(before: Snapshot, decisions: Decisions, limits: dict[str, Limits]) -> None:
    """The reference's invariants, on a session's cycle from the state ``before``."""
    world = World(
        cluster=before.cluster,
        nodes=list(before.node_list()),
        running=list(before.running),
        pending=list(before.pending),
        policy=before.policy,
        limits=limits,
    )
    check_no_overcommit(world, decisions)
    check_gangs(world, decisions)
    check_outcomes(world, decisions)
    check_victims(world, decisions)
    check_quota(world, decisions)


@SETTINGS
@given(worlds(), st.data())
def test_a_session_keeps_the_state_a_snapshot_rebuilds(world: World, data: st.DataObject) -> None:
    session = Session.from_snapshot(world.snapshot())
    leaves = sorted(q.name for q in world.cluster.leaves)
    pools = sorted(world.cluster.pools)
    now = NOW
    for step in range(data.draw(st.integers(1, 5), label="steps")):
        before = session.snapshot(now)
        decisions = session.cycle(now)
        check_all(before, decisions, world.limits)
        assert_same_state(session)
        # The world moves on: victims stop (some still stopping), jobs end or are
        # cancelled, new jobs arrive.
        for preempt in decisions.preemptions:
            still = data.draw(st.booleans(), label="still stopping")
            for victim in preempt.victims:
                if still:
                    session.stopping(victim.job)
                else:
                    session.gone(victim.job)
            if still:
                pending = session.pending_job(preempt.job)
                assert pending is not None
                session.update(replace(pending, preempting=tuple(v.job for v in preempt.victims)))
        for job_id in sorted(session.running):
            if data.draw(st.integers(0, 3), label="ends") == 0:
                session.gone(job_id)
        pending_ids = sorted(j.id for j in session.pending())
        for job_id in pending_ids:
            if data.draw(st.integers(0, 7), label="cancelled") == 0:
                assert session.withdraw(job_id) is not None
        for new in data.draw(job_streams(f"s{step}-", leaves, pools, max_jobs=6)):
            session.submit(replace(new, submit_time=now + data.draw(st.integers(0, 60))))
        # Preemptors whose victims are all gone compete afresh.
        for pending in list(session.pending()):
            if pending.preempting and not any(v in session.running for v in pending.preempting):
                session.update(replace(pending, preempting=()))
        assert_same_state(session)
        now += data.draw(st.sampled_from([0.0, 1.0, 600.0]), label="dt")


def _cluster() -> ClusterBuilder:
    return (
        ClusterBuilder()
        .pool("a100", nodes=2, gpu=8)
        .leaf("team-a", quota={"a100": {"gpu": 8}})
        .leaf("team-b", quota={"a100": {"gpu": 8}})
    )


@SETTINGS
@patches_core
@given(worlds())
def test_settling_a_line_of_known_answers_at_once_changes_no_decision(world: World) -> None:
    """A line whose remaining jobs all take answers already given this cycle is settled
    at once instead of turn by turn; the same snapshot decides the same either way, and
    every job gets the same reason."""
    snapshot = world.snapshot()
    settled = schedule_once(snapshot)
    with patch.object(cycle_module._Cycle, "_settle_tail", lambda self, line: False):
        turned = schedule_once(snapshot)
    assert settled.admitted == turned.admitted
    assert settled.preemptions == turned.preemptions
    assert settled.reservations == turned.reservations
    assert dict(settled.waiting.items()) == dict(turned.waiting.items())


def _full_node(backfill_depth: int) -> Session:
    """One 8-GPU node, full with team-a's job ``r``; team-b is guaranteed nothing."""
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=1, gpu=8)
        .leaf("team-a", quota={"a100": {"gpu": 8}})
        .leaf("team-b", quota={"a100": {"gpu": 0}})
        .build()
    )
    session = Session(cluster, SchedulerPolicy(backfill_depth=backfill_depth))
    session.started(running("r", "team-a", "a100-00", gpu=8))
    return session


@patches_core
def test_a_line_of_jobs_asking_what_failed_is_settled_at_once() -> None:
    """Behind a head that does not fit, jobs asking the same take its answer: the line
    is settled in one step (not a heap turn each), up to the backfill depth, and each of
    them waits with the head's reason."""
    session = _full_node(backfill_depth=4)
    for i in range(10):
        session.submit(job(f"a{i}", "team-a", gpu=4, submit=NOW + i))
    session.submit(job("b0", "team-b", gpu=1, submit=NOW))
    calls: list[bool] = []
    settle = cycle_module._Cycle._settle_tail

    def spy(self: cycle_module._Cycle, line: Line) -> bool:
        calls.append(settle(self, line))
        return calls[-1]

    with patch.object(cycle_module._Cycle, "_settle_tail", spy):
        decisions = session.cycle(NOW + 20)
    assert True in calls
    assert decisions.stats["examined"] == 1 + 4 + 1  # a0 tried, a1..a4 settled, b0
    head = decisions.waiting["a0"]
    assert all(decisions.waiting[f"a{i}"] == head for i in range(1, 5))
    assert decisions.waiting["a5"].code.value == "behind_higher_priority"


def test_admitted_jobs_run_in_the_session_until_they_are_gone() -> None:
    cluster = _cluster().build()
    session = Session(cluster)
    session.submit(job("a", "team-a", gpu=8))
    session.submit(job("b", "team-a", gpu=8))
    session.submit(job("c", "team-a", gpu=8, submit=NOW + 1))
    first = session.cycle(NOW)
    assert [a.job for a in first.admitted] == ["a", "b"]  # b borrows team-b's idle share
    assert set(session.running) == {"a", "b"}
    assert [j.id for j in session.pending()] == ["c"]
    assert session.cycle(NOW + 1).admitted == []
    session.gone("a")
    assert [a.job for a in session.cycle(NOW + 2).admitted] == ["c"]
    assert session.pending_count == 0


def test_unknown_and_duplicate_ids_are_refused() -> None:
    session = Session(_cluster().build())
    session.submit(job("a", "team-a", gpu=1))
    with pytest.raises(ValueError, match="already known"):
        session.submit(job("a", "team-a", gpu=1))
    with pytest.raises(ValueError, match="pending"):
        session.started(running("a", "team-a", "a100-00"))
    assert session.withdraw("nope") is None
    assert session.gone("nope") is None
    with pytest.raises(ValueError, match="backwards"):
        session.cycle(NOW)
        session.cycle(NOW - 1)


def test_a_terminating_job_holds_its_resources_until_gone() -> None:
    session = Session(_cluster().build())
    session.started(running("r", "team-b", {"a100-00": 8, "a100-01": 8}))
    session.submit(job("a", "team-a", gpu=8))
    decisions = session.cycle(NOW)
    assert [v.job for p in decisions.preemptions for v in p.victims] == ["r"]
    session.stopping("r")
    pending = session.pending_job("a")
    assert isinstance(pending, PendingJob)
    session.update(replace(pending, preempting=("r",)))
    held = session.cycle(NOW + 1)
    assert held.admitted == [] and held.waiting["a"].code.value == "waiting_for_preemption"
    session.gone("r")
    session.update(replace(pending, preempting=()))
    assert [a.job for a in session.cycle(NOW + 2).admitted] == ["a"]


def test_explain_off_skips_the_reasons_of_jobs_not_looked_at() -> None:
    strict = (
        ClusterBuilder()
        .pool("a100", nodes=2, gpu=8)
        .leaf("team-a", quota={"a100": {"gpu": 8}}, queueing="strict")
        .leaf("team-b", quota={"a100": {"gpu": 8}})
    )
    session = Session(strict.build())
    for i in range(5):
        session.submit(job(f"j{i}", "team-a", gpu=8, submit=NOW + i))
    quiet = session.cycle(NOW + 10, explain=False)
    assert [a.job for a in quiet.admitted] == ["j0", "j1"]
    assert quiet.queue_order == {}
    assert "j4" not in quiet.waiting
    loud = session.cycle(NOW + 11)
    assert set(loud.waiting) == {"j2", "j3", "j4"}
    assert loud.queue_order == {"team-a": ["j2", "j3", "j4"]}


@pytest.mark.parametrize(
    ("queueing", "started"), [("strict", ["first"]), (None, ["first", "small"])]
)
def test_a_remembered_failed_placement_does_not_hide_a_quota_block(
    queueing: str | None, started: list[str]
) -> None:
    """Found by the property below: a job whose placement failed in an earlier cycle
    and which is now out of quota must wait as out of quota, whether the failure is
    remembered (explain off) or not: a strict queue starts nothing behind it; a best
    effort one starts the smaller job behind it that fits its quota."""
    extra = {} if queueing is None else {"queueing": queueing}
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=2, gpu=8)
        .leaf("team-a", quota={"a100": {"gpu": 8}}, **extra)
        .leaf("team-b", quota={"a100": {"gpu": 8}})
    )
    sessions = [Session(cluster.build()) for _ in range(2)]
    for session in sessions:
        session.started(running("b1", "team-b", "a100-00", gpu=6))
        session.started(running("b2", "team-b", "a100-01", gpu=2))
        session.submit(job("big", "team-a", gpu=8, submit=NOW))
    quiet, loud = sessions
    assert quiet.cycle(NOW, explain=False).admitted == []
    assert loud.cycle(NOW).admitted == []
    for session in sessions:
        session.submit(job("first", "team-a", gpu=4, prio="key-project", submit=NOW + 1))
        session.submit(job("small", "team-a", gpu=1, submit=NOW + 2))
    a, b = quiet.cycle(NOW + 10, explain=False), loud.cycle(NOW + 10)
    assert [x.job for x in a.admitted] == [x.job for x in b.admitted] == started
    assert a.waiting["big"].code.value == b.waiting["big"].code.value == "quota_exhausted"


def test_a_cycle_that_could_see_nothing_new_is_not_run_again() -> None:
    """Without explanations, after a cycle that decided nothing, the next cycle is
    answered without being run while nothing it would look at changed: arrivals behind
    where each line stopped. A job ahead of that point, one in a line looked at to its
    end, a job's end, or a wait that reaches ``reserve_after`` makes it run."""
    session = _full_node(backfill_depth=2)
    for i in range(5):
        session.submit(job(f"w{i}", "team-a", gpu=8, submit=NOW + i))
    first = session.cycle(NOW + 10, explain=False)
    assert first.admitted == [] and not first.stats.get("quiet")
    session.submit(job("late", "team-a", gpu=8, submit=NOW + 20))
    again = session.cycle(NOW + 30, explain=False)
    assert again.stats.get("quiet") is True and again.admitted == []
    # Explaining runs the cycle whatever happened (its reasons are wanted).
    assert not session.cycle(NOW + 31).stats.get("quiet")
    assert not session.cycle(NOW + 32, explain=False).stats.get("quiet")
    assert session.cycle(NOW + 33, explain=False).stats.get("quiet") is True
    session.submit(job("other", "team-b", gpu=1, submit=NOW + 34))  # a line seen whole
    assert not session.cycle(NOW + 35, explain=False).stats.get("quiet")
    session.submit(job("urgent", "team-a", gpu=1, submit=NOW - 100))  # ahead of w0
    assert not session.cycle(NOW + 37, explain=False).stats.get("quiet")
    assert session.cycle(NOW + 38, explain=False).stats.get("quiet") is True
    # w0 has waited reserve_after (four hours) by then: the cycle runs again.
    assert not session.cycle(NOW + 4 * 3600 + 1, explain=False).stats.get("quiet")
    session.gone("r")
    ended = session.cycle(NOW + 4 * 3600 + 2, explain=False)
    assert {a.job for a in ended.admitted} == {"urgent", "other"}
    assert not ended.stats.get("quiet")


@SETTINGS
@given(worlds(), st.data())
def test_what_a_session_remembers_across_cycles_changes_no_decision(
    world: World, data: st.DataObject
) -> None:
    """Failed placements and victim searches are remembered across cycles (placements only
    without explanations). Two sessions fed the same events, one explaining (placements
    not remembered) and one not, decide the same at every cycle."""
    quiet = Session.from_snapshot(world.snapshot())
    loud = Session.from_snapshot(world.snapshot())
    leaves = sorted(q.name for q in world.cluster.leaves)
    pools = sorted(world.cluster.pools)
    now = NOW
    for step in range(data.draw(st.integers(2, 6), label="steps")):
        a = quiet.cycle(now, explain=False)
        b = loud.cycle(now)
        assert a.admitted == b.admitted
        assert a.preemptions == b.preemptions
        assert a.reservations == b.reservations
        for preempt in a.preemptions:
            for victim in preempt.victims:
                quiet.gone(victim.job)
                loud.gone(victim.job)
        # Some steps end nothing: a cycle after one that decided nothing may then be
        # answered without being run (see the test above).
        ending = data.draw(st.booleans(), label="any ends")
        for job_id in sorted(quiet.running):
            if ending and data.draw(st.integers(0, 3), label="ends") == 0:
                quiet.gone(job_id)
                loud.gone(job_id)
        for new in data.draw(job_streams(f"s{step}-", leaves, pools, max_jobs=5)):
            arrival = replace(new, submit_time=now + data.draw(st.integers(0, 60)))
            quiet.submit(arrival)
            loud.submit(arrival)
        now += data.draw(st.sampled_from([0.0, 1.0, 600.0]), label="dt")


def test_a_gate_answer_is_kept_but_never_for_a_job_in_back_off() -> None:
    """The gates' answer for a request is kept across cycles (it depends on the
    configuration alone), except for a job in back-off, whose answer depends on the
    time: it is tried once its back-off ends, and the same request without one is
    tried at once."""
    cluster = ClusterBuilder().pool("a100", nodes=1).leaf("a", quota={"a100": {"gpu": 8}}).build()
    session = Session(cluster, now=NOW)
    session.submit(job("late", "a", gpu=4, not_before=NOW + 30))
    session.submit(job("now", "a", gpu=4, submit=NOW - 30))
    first = session.cycle(NOW)
    assert [a.job for a in first.admitted] == ["now"]
    assert first.waiting["late"].code.value == "backoff"
    session.submit(job("too-big", "a", gpu=16))
    second = session.cycle(NOW + 31)
    assert [a.job for a in second.admitted] == ["late"]
    assert second.waiting["too-big"].code.value == "no_node_fits"
    session.submit(job("too-big-again", "a", gpu=16))
    third = session.cycle(NOW + 32)
    assert third.waiting["too-big-again"] == second.waiting["too-big"]


def test_an_invalid_jobs_reason_names_its_own_replica_group() -> None:
    """Two jobs asking the same invalid shape from replica groups of different names
    each get a reason naming their own group (gate answers are kept, invalid ones not)."""
    cluster = ClusterBuilder().pool("a100", nodes=1).leaf("a", quota={"a100": {"gpu": 8}}).build()
    session = Session(cluster, now=NOW)
    bad = job("bad-1", "a", gpu=1.5)
    session.submit(bad)
    other = replace(
        job("bad-2", "a", gpu=1.5), replicas=(replace(bad.replicas[0], name="trainer"),)
    )
    session.submit(other)
    decisions = session.cycle(NOW)
    assert "replica group worker" in decisions.waiting["bad-1"].message
    assert "replica group trainer" in decisions.waiting["bad-2"].message
