"""The policy seam: switches compose to one strategy per concern, and each strategy
decides only its concern."""

from __future__ import annotations

import itertools

import pytest

from allotment.scheduler.lines import Outcome
from allotment.scheduler.policy import (
    Backfill,
    BackfillFifo,
    BestEffortFifo,
    BorrowingQuota,
    FairShareOrder,
    IsolatedQuota,
    NoReservations,
    StrictFifo,
    SubmitOrder,
    compose,
)
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.scheduler.victims import (
    NoPreemption,
    PriorityAndReclaim,
    ReclaimOnly,
    WithinQueueOnly,
)

from .builders import NOW, ClusterBuilder, job

SWITCHES = ("borrowing", "preemption", "reclaim", "fair_share", "backfill", "strict_fifo")


@pytest.mark.parametrize("values", list(itertools.product([False, True], repeat=len(SWITCHES))))
def test_every_combination_of_switches_composes(values: tuple[bool, ...]) -> None:
    on = dict(zip(SWITCHES, values, strict=True))
    rules = compose(SchedulerPolicy(**on))
    assert isinstance(rules.order, FairShareOrder if on["fair_share"] else SubmitOrder)
    assert isinstance(rules.quota, BorrowingQuota if on["borrowing"] else IsolatedQuota)
    assert isinstance(rules.reservations, Backfill if on["backfill"] else NoReservations)
    victims = {
        (False, False): NoPreemption,
        (False, True): ReclaimOnly,
        (True, False): WithinQueueOnly,
        (True, True): PriorityAndReclaim,
    }[(on["preemption"], on["reclaim"])]
    assert isinstance(rules.victims, victims)
    line = (
        BestEffortFifo if not on["strict_fifo"] else BackfillFifo if on["backfill"] else StrictFifo
    )
    assert isinstance(rules.line, line)


def test_the_numbers_reach_their_strategies() -> None:
    rules = compose(SchedulerPolicy(aging_horizon=60.0, max_reservations=3, reserve_after=600.0))
    assert rules.order == FairShareOrder(60.0)
    assert rules.reservations == Backfill(3, 600.0)
    # Without reclaim nothing takes a guarantee back: classic EASY backfill reserves at once.
    easy = compose(SchedulerPolicy(reclaim=False, max_reservations=3, reserve_after=600.0))
    assert easy.reservations == Backfill(3, 0.0)


def _no_share(queue: str) -> float:
    raise AssertionError("submission order needs no share")


def test_submit_order_ignores_shares_and_fair_share_ages() -> None:
    early = job("early", "a", submit=NOW - 7200)
    late = job("late", "b", submit=NOW - 60)
    fifo = SubmitOrder()
    assert fifo.key(early, 0, "a", False, NOW, _no_share) < fifo.key(
        late, 0, "b", False, NOW, _no_share
    )
    # A guaranteed head goes before a borrowing one, whatever the order says.
    assert fifo.key(late, 0, "b", False, NOW, _no_share) < fifo.key(
        early, 0, "a", True, NOW, _no_share
    )
    shares = {"a": 0.9, "b": 0.5}.__getitem__
    fair = FairShareOrder(aging_horizon=3600.0)
    # a's share is higher, but two hours of waiting are worth two whole units.
    assert fair.key(early, 0, "a", False, NOW, shares) < fair.key(late, 0, "b", False, NOW, shares)
    no_aging = FairShareOrder(aging_horizon=0.0)
    assert no_aging.key(late, 0, "b", False, NOW, shares) < no_aging.key(
        early, 0, "a", False, NOW, shares
    )


def test_quota_rules_limit_and_route() -> None:
    cluster = (
        ClusterBuilder()
        .pool("pa")
        .pool("pb")
        .leaf("a", quota={"pa": {"gpu": 4}}, borrowing_limit={"pb": {"gpu": 2}})
        .build()
    )
    a = cluster.queues["a"]
    isolated, borrowing = IsolatedQuota(), BorrowingQuota()
    assert isolated.limit(a, "pa") == {"gpu": 4000}
    assert isolated.limit(a, "pb") == {"*": 0}
    assert borrowing.limit(a, "pa") == {}
    assert borrowing.limit(a, "pb") == {"gpu": 2000}
    assert isolated.pools(a, ["pb", "pa"]) == (["pa"], 0)
    assert borrowing.pools(a, ["pb", "pa"]) == (["pa", "pb"], 1)
    too_big = {"gpu": 5000}
    reason = isolated.ceiling(a, ["pa"], too_big)
    assert reason is not None and reason.code.value == "exceeds_queue_limit"
    assert isolated.ceiling(a, ["pa"], {"gpu": 4000}) is None
    assert borrowing.ceiling(a, ["pa"], too_big) is None  # no borrowing limit in pa
    assert borrowing.ceiling(a, ["pb"], {"gpu": 3000}) is not None


def test_line_rules_say_which_waiting_heads_end_a_line() -> None:
    cluster = (
        ClusterBuilder()
        .pool("pa")
        .leaf("strict", quota={"pa": {"gpu": 4}}, queueing="strict")
        .leaf("open", quota={"pa": {"gpu": 4}})
        .build()
    )
    strict, open_ = cluster.queues["strict"], cluster.queues["open"]
    assert BestEffortFifo().ends(open_) == frozenset()
    assert BestEffortFifo().ends(strict) == {Outcome.QUOTA}
    assert BackfillFifo().ends(open_) == {Outcome.QUOTA}
    assert StrictFifo().ends(open_) == {Outcome.QUOTA, Outcome.CAPACITY}
