"""Ordering: priority first, fair share across queues, aging, FIFO within a queue."""

from __future__ import annotations

from typing import Any

from allotment.scheduler.decisions import Decisions
from allotment.scheduler.snapshot import PendingJob, SchedulerPolicy

from .builders import (
    NOW,
    ClusterBuilder,
    admitted,
    codes,
    cycle,
    job,
    running,
    two_owned_pools,
    victims,
)


def one_node_two_queues(**pool: object) -> ClusterBuilder:
    return (
        ClusterBuilder()
        .pool("a100", nodes=1, **pool)
        .leaf("a", quota={"a100": {"gpu": 4}})
        .leaf("b", quota={"a100": {"gpu": 4}})
    )


def test_higher_priority_goes_first_across_queues() -> None:
    cluster = one_node_two_queues().build()
    decisions = cycle(
        cluster,
        [
            job("low", "a", gpu=8, prio="experiment", submit=NOW - 500),
            job("high", "b", gpu=8, prio="key-project", submit=NOW - 10),
        ],
    )
    assert admitted(decisions) == ["high"]
    assert codes(decisions)["low"] in {"quota_exhausted", "no_node_fits"}


def test_fifo_within_a_queue() -> None:
    cluster = one_node_two_queues().build()
    decisions = cycle(
        cluster,
        [
            job("second", "a", gpu=6, submit=NOW - 10),
            job("first", "a", gpu=6, submit=NOW - 20),
        ],
    )
    assert admitted(decisions) == ["first"]
    assert decisions.queue_order == {"a": ["first", "second"]}
    assert decisions.position("second", "a") == 2
    assert decisions.position("nope", "a") is None


def test_priority_before_fifo_within_a_queue() -> None:
    cluster = one_node_two_queues().build()
    decisions = cycle(
        cluster,
        [
            job("old", "a", gpu=6, submit=NOW - 100, prio="experiment"),
            job("urgent", "a", gpu=6, submit=NOW - 10, prio="key-project"),
        ],
    )
    assert admitted(decisions) == ["urgent"]


def overlapping_guarantees() -> ClusterBuilder:
    """One 8-GPU node, each queue guaranteed all of it: nobody needs to borrow, so the
    order is decided by share, submission and age alone."""
    return (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .leaf("a", quota={"a100": {"gpu": 8}})
        .leaf("b", quota={"a100": {"gpu": 8}})
    )


SHARE_PENDING = [
    job("a-next", "a", gpu=4, submit=NOW - 300),
    job("b-next", "b", gpu=4, submit=NOW - 5),
]
SHARE_RUNS = [running("a-run", "a", "a100-00", gpu=4)]


def test_queue_below_its_share_goes_first() -> None:
    # a already uses half its guarantee; b uses nothing. b's later job goes first.
    decisions = cycle(overlapping_guarantees().build(), SHARE_PENDING, SHARE_RUNS)
    assert admitted(decisions) == ["b-next"]


def test_without_fair_share_submission_order_across_queues() -> None:
    decisions = cycle(
        overlapping_guarantees().build(),
        SHARE_PENDING,
        SHARE_RUNS,
        policy=SchedulerPolicy(fair_share=False),
    )
    assert admitted(decisions) == ["a-next"]


def test_aging_lets_a_long_waiting_job_overtake_a_fairer_queue() -> None:
    cluster = overlapping_guarantees().build()
    pending = [
        job("a-old", "a", gpu=4, submit=NOW - 3 * 3600),
        job("b-new", "b", gpu=4, submit=NOW - 5),
    ]
    # a's share is 0.5; with a one-hour horizon three hours of waiting outweighs it.
    aged = cycle(cluster, pending, SHARE_RUNS, policy=SchedulerPolicy(aging_horizon=3600))
    assert admitted(aged) == ["a-old"]
    no_aging = cycle(cluster, pending, SHARE_RUNS, policy=SchedulerPolicy(aging_horizon=0))
    assert admitted(no_aging) == ["b-new"]


def test_guaranteed_heads_go_before_borrowing_heads() -> None:
    cluster = one_node_two_queues().build()
    # a has used its 4; its next job would borrow. b's job fits b's own guarantee and
    # goes first even though it came later and has a lower priority.
    decisions = cycle(
        cluster,
        [
            job("a-borrow", "a", gpu=4, submit=NOW - 300, prio="key-project"),
            job("b-own", "b", gpu=4, submit=NOW - 5, prio="experiment"),
        ],
        [running("a-run", "a", "a100-00", gpu=4)],
    )
    assert admitted(decisions) == ["b-own"]


def owner_and_guest(*pending: PendingJob) -> Decisions:
    """Queue b's own pool (two 4-GPU nodes) has 4 of its 8 guaranteed GPUs free, 2 on
    each node, so a 4-GPU job of b fits its guarantee but no node there; queue a's pool
    (one 8-GPU node) has 4 of a's 8 free."""
    cluster = two_owned_pools()
    runs = [
        running("a-run", "a", "a100-00", gpu=4),
        running("b-run0", "b", "v100-00", gpu=2),
        running("b-run1", "b", "v100-01", gpu=2),
    ]
    return cycle(cluster, list(pending), runs)


def test_a_job_that_fits_only_where_it_would_borrow_lets_that_pools_owner_go_first() -> None:
    # b's job came first and, fitting b's guarantee, is ordered among the jobs that would
    # not borrow; but the only pool where it fits is a's, where it would borrow. a's job,
    # within a's guarantee there, goes first: were b's job admitted, a would reclaim it
    # in the next cycle (a preemption for nothing).
    decisions = owner_and_guest(
        job("b-first", "b", gpu=4, submit=NOW - 300), job("a-second", "a", gpu=4)
    )
    assert admitted(decisions) == ["a-second"]
    assert codes(decisions)["b-first"] == "no_node_fits"


def test_a_job_borrows_where_it_fits_when_the_pools_owner_waits_for_nothing() -> None:
    decisions = owner_and_guest(job("b-first", "b", gpu=4, submit=NOW - 300))
    assert admitted(decisions) == ["b-first"]
    assert decisions.admitted[0].pool == "a100"


def test_a_job_borrows_where_the_pools_owner_waits_only_for_more_than_is_free() -> None:
    decisions = owner_and_guest(
        job("b-first", "b", gpu=4, submit=NOW - 300), job("a-big", "a", gpu=8)
    )
    assert admitted(decisions) == ["b-first"]
    assert decisions.admitted[0].pool == "a100"


def owner_gang_and_guest(borrower_class: str) -> Decisions:
    """b already borrows 4 GPUs of a's pool (a job of ``borrower_class``); a's gang asks
    all 8, more than the 4 free, but within a's guarantee. b's new job, tried first for
    its priority, fits b's guarantee but only a's pool, where it would borrow."""
    cluster = two_owned_pools()
    runs = [
        running("b-borrow", "b", "a100-00", gpu=4, prio=borrower_class),
        running("b-run0", "b", "v100-00", gpu=2),
        running("b-run1", "b", "v100-01", gpu=2),
    ]
    pending = [
        job("b-first", "b", gpu=4, submit=NOW - 300, prio="key-project"),
        job("a-gang", "a", gpu=8),
    ]
    return cycle(cluster, pending, runs)


def test_a_job_lets_the_pools_owner_go_first_when_it_would_take_back_more_than_is_free() -> None:
    # a's gang takes the borrower back and the free 4. Were b's new job admitted into
    # those free 4, a could not take it back in the same cycle (it was just admitted)
    # and would in the next (a preemption for nothing).
    decisions = owner_gang_and_guest("training")
    assert admitted(decisions) == []
    assert victims(decisions) == {"a-gang": ["b-borrow"]}
    reason = decisions.waiting.get("b-first")
    assert reason is not None and reason.detail["reserved_for"] == ["a-gang"]


def test_a_job_sent_back_for_the_pools_owner_still_borrows_the_room_the_owner_cannot_use() -> None:
    # b's borrower is of a class that may not be preempted: a's gang cannot take it
    # back, so the room stays free for b's new job in the same cycle.
    decisions = owner_gang_and_guest("production")
    assert admitted(decisions) == ["b-first"]
    assert decisions.admitted[0].pool == "a100"
    assert victims(decisions) == {}
    assert codes(decisions)["a-gang"] == "no_node_fits"


def test_weight_scales_the_share() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .leaf("a", quota={"a100": {"gpu": 4}}, weight=4)
        .leaf("b", quota={"a100": {"gpu": 4}})
        .build()
    )
    runs = [
        running("a-run", "a", "a100-00", gpu=2, first_device=0),
        running("b-run", "b", "a100-00", gpu=1, first_device=2),
    ]
    # shares: a = 0.5 / 4 = 0.125, b = 0.25 → a goes first.
    decisions = cycle(
        cluster,
        [job("b2", "b", gpu=5, submit=NOW - 100), job("a2", "a", gpu=5, submit=NOW - 50)],
        runs,
    )
    assert admitted(decisions) == ["a2"]


def quota_short_head(queueing: str | None = None, **policy: Any) -> Decisions:
    """Queue a (4 GPUs guaranteed, nothing to borrow) runs 2; its head asks 4, the job
    behind it 2. The node has room for both."""
    extra = {} if queueing is None else {"queueing": queueing}
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .leaf("a", quota={"a100": {"gpu": 4}}, borrowing_limit={"a100": {"gpu": 0}}, **extra)
        .leaf("b", quota={"a100": {"gpu": 4}})
        .build()
    )
    return cycle(
        cluster,
        [job("head", "a", gpu=4, submit=NOW - 20), job("small", "a", gpu=2, submit=NOW - 10)],
        [running("a-run", "a", "a100-00", gpu=2)],
        policy=SchedulerPolicy(**policy),
    )


def test_a_head_short_of_quota_lets_the_jobs_behind_it_that_fit_start() -> None:
    decisions = quota_short_head()
    assert admitted(decisions) == ["small"]
    assert codes(decisions)["head"] == "quota_exhausted"


def test_a_strict_queue_starts_nothing_past_a_head_short_of_quota() -> None:
    decisions = quota_short_head("strict")
    assert admitted(decisions) == []
    assert codes(decisions) == {"head": "quota_exhausted", "small": "behind_higher_priority"}
    assert decisions.waiting["small"].detail["blocking_job"] == "head"


def test_queueing_is_inherited_and_strict_fifo_policies_are_strict_everywhere() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .parent("org", queueing="strict")
        .leaf("a", parent="org", quota={"a100": {"gpu": 4}})
        .leaf("b", parent="org", quota={"a100": {"gpu": 4}}, queueing="best_effort")
        .build()
    )
    assert cluster.queues["a"].strict and not cluster.queues["b"].strict
    decisions = quota_short_head(strict_fifo=True)
    assert admitted(decisions) == []
