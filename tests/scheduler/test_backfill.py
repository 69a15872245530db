"""Backfill: a blocked job gets a reservation; later jobs start only if they don't delay it."""

from __future__ import annotations

from allotment.domain.reasons import Reason
from allotment.scheduler.pool_tries import PoolTries
from allotment.scheduler.snapshot import SchedulerPolicy, Snapshot
from allotment.scheduler.state import CycleState

from .builders import NOW, ClusterBuilder, admitted, codes, cycle, job, res, running


def two_nodes() -> ClusterBuilder:
    return ClusterBuilder().pool("a100", nodes=2).leaf("a", quota={"a100": {"gpu": 16}})


AT_ONCE = SchedulerPolicy(reserve_after=0.0)
"""Blocked jobs reserve as soon as they wait (the mechanism under test; by default a job
waits ``reserve_after`` first, see the last test)."""

RUNS = [
    running("r0", "a", "a100-00", gpu=4, end=NOW + 3600),
    running("r1", "a", "a100-01", gpu=4, end=NOW + 7200),
]


def test_blocked_job_gets_a_reservation() -> None:
    decisions = cycle(two_nodes().build(), [job("big", "a", gpu=8)], RUNS, policy=AT_ONCE)
    assert codes(decisions) == {"big": "no_node_fits"}
    assert decisions.reservations == {"big": NOW + 3600}


def test_short_job_backfills_before_the_reservation() -> None:
    pending = [
        job("big", "a", gpu=8, submit=1),
        job("short", "a", gpu=4, submit=2, max_runtime=1800),
        job("long", "a", gpu=4, submit=3, max_runtime=86400),
    ]
    decisions = cycle(two_nodes().build(), pending, RUNS, policy=AT_ONCE)
    # short ends before a100-00 frees up for big; long goes on a100-01, not reserved.
    assert admitted(decisions) == ["short", "long"]
    nodes = {a.job: a.placements[0].node for a in decisions.admitted}
    assert nodes == {"short": "a100-00", "long": "a100-01"}
    assert all(a.backfilled for a in decisions.admitted)


def test_unbounded_job_may_not_take_reserved_capacity() -> None:
    pending = [
        job("big", "a", gpu=8, submit=1),
        job("x1", "a", gpu=4, submit=2),
        job("x2", "a", gpu=4, submit=3),
    ]
    decisions = cycle(two_nodes().build(), pending, RUNS, policy=AT_ONCE)
    # x1 fits beside the reservation on a100-01; x2 would need the reserved a100-00.
    assert admitted(decisions) == ["x1"]
    assert decisions.admitted[0].placements[0].node == "a100-01"
    assert codes(decisions)["x2"] == "behind_higher_priority"
    assert decisions.waiting["x2"].detail["reserved_for"] == ["big"]


def test_a_job_that_would_not_fit_without_the_reservation_is_told_so() -> None:
    # big, a gang of two whole nodes, reserves a100-02 (free) and a100-00 (once r0
    # ends). pair, two 6-GPU replicas, finds no room beside that reservation, but it
    # would not fit without it either: one replica fits on a100-02 as things are. Its
    # reason says that, not "no node has 6 gpu free" beside a largest free slot of 8.
    cluster = ClusterBuilder().pool("a100", nodes=3).leaf("a", quota={"a100": {"gpu": 24}})
    pending = [
        job("big", "a", gpu=8, replicas=2, submit=1),
        job("pair", "a", gpu=6, replicas=2, submit=2),
    ]
    decisions = cycle(cluster.build(), pending, RUNS, policy=AT_ONCE)
    assert decisions.reservations["big"] == NOW + 3600
    reason = decisions.waiting["pair"]
    assert reason.code.value == "gang_unsatisfiable"
    assert reason.detail["placeable"] == 1
    assert "only 1 of 2 replicas fit at once" in reason.message


def test_strict_fifo_without_backfill_blocks_the_queue() -> None:
    pending = [job("big", "a", gpu=8, submit=1), job("small", "a", gpu=1, submit=2)]
    policy = SchedulerPolicy(backfill=False, strict_fifo=True)
    decisions = cycle(two_nodes().build(), pending, RUNS, policy=policy)
    assert admitted(decisions) == []
    assert codes(decisions) == {"big": "no_node_fits", "small": "behind_higher_priority"}
    assert decisions.waiting["small"].detail["blocking_job"] == "big"


def test_best_effort_fifo_without_backfill_lets_small_jobs_pass() -> None:
    pending = [job("big", "a", gpu=8, submit=1), job("small", "a", gpu=1, submit=2)]
    policy = SchedulerPolicy(backfill=False)
    decisions = cycle(two_nodes().build(), pending, RUNS, policy=policy)
    assert admitted(decisions) == ["small"]


def test_backfill_depth_bounds_the_work() -> None:
    # 8-GPU jobs wait for capacity (jobs that could never fit are gated and do not count).
    pending = [job("big", "a", gpu=8, submit=0)]
    pending += [job(f"j{i}", "a", gpu=8, submit=i + 1) for i in range(20)]
    decisions = cycle(two_nodes().build(), pending, RUNS, policy=SchedulerPolicy(backfill_depth=3))
    assert decisions.stats["examined"] == 4  # big, then 3 more past it
    assert set(codes(decisions).values()) <= {"no_node_fits", "behind_higher_priority"}
    assert len(decisions.waiting) == 21


def test_a_borrower_gets_no_reservation_a_job_within_its_guarantee_does() -> None:
    """Capacity held idle for a borrower is wasted: reclaim may evict it as soon as it
    starts. A job within its guarantee is still protected by a reservation."""
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=2)
        .leaf("a", quota={"a100": {"gpu": 8}})
        .leaf("b", quota={"a100": {"gpu": 8}})
        .build()
    )
    runs = [
        running("r0", "a", "a100-00", gpu=4, end=NOW + 3600),
        running("r1", "a", "a100-01", gpu=4, end=NOW + 7200),
    ]
    # a uses 8 of its 8: its 8-GPU job would borrow all of it.
    borrower = cycle(cluster, [job("big", "a", gpu=8)], runs, policy=AT_ONCE)
    assert codes(borrower) == {"big": "no_node_fits"}
    assert borrower.reservations == {}
    # b uses nothing: the same job is within its guarantee.
    owner = cycle(cluster, [job("big", "b", gpu=8)], runs, policy=AT_ONCE)
    assert owner.reservations == {"big": NOW + 3600}


def test_no_reservation_without_a_known_start_so_nothing_is_held_idle() -> None:
    """When no running job says when it ends (no expected runtime, no max_runtime), the
    blocked job's start is unknown: it gets no reservation, and the job behind it takes
    the free capacity instead of the capacity being drained for an unknown time."""
    runs = [running("r0", "a", "a100-00", gpu=4), running("r1", "a", "a100-01", gpu=4)]
    pending = [job("big", "a", gpu=8, submit=1), job("small", "a", gpu=4, submit=2)]
    decisions = cycle(two_nodes().build(), pending, runs, policy=AT_ONCE)
    assert decisions.reservations == {}
    assert admitted(decisions) == ["small"]
    assert codes(decisions) == {"big": "no_node_fits"}


def test_a_guest_in_another_queue_s_pool_gets_no_reservation_there() -> None:
    """Queue b is guaranteed nothing in pool pa: its job there borrows all it uses (even
    when the quota check fits), so it holds nothing idle for itself in pa."""
    cluster = (
        ClusterBuilder()
        .pool("pa", nodes=2)
        .pool("pb", nodes=1)
        .leaf("a", quota={"pa": {"gpu": 16}})
        .leaf("b", quota={"pb": {"gpu": 8}})
        .build()
    )
    runs = [
        running("a0", "a", "pa-00", gpu=4, end=NOW + 3600),
        running("a1", "a", "pa-01", gpu=4, end=NOW + 7200),
        running("b0", "b", "pb-00", gpu=8, end=NOW + 7200),
    ]
    decisions = cycle(cluster, [job("big", "b", gpu=8)], runs, policy=AT_ONCE)
    assert admitted(decisions) == []
    assert decisions.reservations == {}
    # The pool's owner, asking the same, is within its guarantee and gets one.
    owner = cycle(cluster, [job("big", "a", gpu=8)], runs, policy=AT_ONCE)
    assert owner.reservations == {"big": NOW + 3600}


def test_with_reclaim_only_a_job_that_has_waited_long_reserves() -> None:
    """A job within its guarantee takes it back by reclaim; capacity held idle for it is
    the last resort of one that starves: it reserves once it has waited
    ``reserve_after``. The jobs behind a young one take what is free meanwhile."""
    policy = SchedulerPolicy(reserve_after=3600.0)
    young = [job("big", "a", gpu=8, submit=NOW - 60), job("x", "a", gpu=4, submit=NOW - 30)]
    decisions = cycle(two_nodes().build(), young, RUNS, policy=policy)
    assert decisions.reservations == {}
    assert admitted(decisions) == ["x"]
    old = [job("big", "a", gpu=8, submit=NOW - 3600), job("x", "a", gpu=4, submit=NOW - 30)]
    decisions = cycle(two_nodes().build(), old, RUNS, policy=policy)
    assert decisions.reservations == {"big": NOW + 3600}
    assert admitted(decisions) == ["x"]  # beside the reservation, on the other node
    assert decisions.admitted[0].placements[0].node == "a100-01"
    # The backfill preset (no reclaim): the young job reserves at once.
    easy = SchedulerPolicy(reserve_after=3600.0, borrowing=False, reclaim=False, strict_fifo=True)
    decisions = cycle(two_nodes().build(), young, RUNS, policy=easy)
    assert decisions.reservations == {"big": NOW + 3600}


def test_a_job_the_quota_refuses_is_told_so_where_a_reservation_holds_the_free_node() -> None:
    # a's guarantee (20 of the pool's 24, lent to nobody) leaves c's 8-GPU job no room
    # in the pool's quota, though a100-02 is free: the quota's reason. When a
    # reservation claims a100-02, the quota still says no: the same reason, not "no node
    # has 8 gpu free" beside a largest free slot of 8.
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=3)
        .leaf("a", quota={"a100": {"gpu": 20}}, lending_limit={"a100": {"gpu": 0}})
        .leaf("c", quota={"a100": {"gpu": 8}})
        .build()
    )
    snapshot = Snapshot(now=NOW, cluster=cluster, pending=[], running=RUNS, policy=AT_ONCE)
    tries = PoolTries(CycleState.from_snapshot(snapshot), remember=False)
    x = job("x", "c", gpu=8)
    reasons = []
    for claims in (None, {"a100-02": res(gpu=8)}):
        held_back: list[str] = []
        reason = tries.attempt(x, "c", "a100", x.shape(), claims, held_back)
        assert isinstance(reason, Reason)
        assert held_back == []
        reasons.append(reason)
    assert [r.code.value for r in reasons] == ["quota_exhausted", "quota_exhausted"]
    assert "pool a100 is full for queue c" in reasons[1].message
