"""Who borrows from whom: borrowing attributed to the unused quota it uses, nearest
cohort first, split by each lender's share of the unused quota."""

from __future__ import annotations

from allotment.scheduler.lending import UNASSIGNED, Loan, loans_now
from allotment.scheduler.snapshot import RunningJob, SchedulerPolicy, Snapshot

from .builders import NOW, ClusterBuilder, running


def given(builder: ClusterBuilder, *runs: RunningJob) -> dict[tuple[str, str], float]:
    snapshot = Snapshot(
        now=NOW,
        cluster=builder.build(),
        pending=[],
        running=list(runs),
        policy=SchedulerPolicy(),
    )
    found: list[Loan] = loans_now(snapshot)
    assert all(loan.pool == "a100" and loan.resource == "gpu" for loan in found)
    return {(loan.borrower, loan.lender): round(loan.amount / 1000, 3) for loan in found}


def org() -> ClusterBuilder:
    # 4 nodes x 8 GPUs; org holds 24 of the 32, teams a, b, c 8 each; 8 unassigned.
    return (
        ClusterBuilder()
        .pool("a100", nodes=4)
        .parent("org", quota={"a100": {"gpu": 24}})
        .leaf("a", parent="org", quota={"a100": {"gpu": 8}})
        .leaf("b", parent="org", quota={"a100": {"gpu": 8}})
        .leaf("c", parent="org", quota={"a100": {"gpu": 8}})
        .leaf("guest", quota={"a100": {"gpu": 0}})
    )


def test_nothing_borrowed_nothing_lent() -> None:
    assert given(org(), running("r1", "a", "a100-00", gpu=8)) == {}


def test_a_borrower_splits_over_its_siblings_by_their_unused_quota() -> None:
    loans = given(
        org(),
        running("r1", "a", "a100-00", gpu=8),
        running("r2", "a", "a100-01", gpu=4),  # a: 4 beyond its 8
        running("r3", "b", "a100-02", gpu=6),  # b leaves 2 unused, c 8
    )
    assert loans == {("a", "b"): 0.8, ("a", "c"): 3.2}


def test_a_queue_at_the_top_borrows_from_cousins_and_the_pools_unassigned_capacity() -> None:
    # guest (no quota) uses 10 of what a, b, c (8 each) and the pool (8) leave unused.
    loans = given(org(), running("r1", "guest", {"a100-00": 8, "a100-01": 2}))
    assert loans == {
        ("guest", "a"): 2.5,
        ("guest", "b"): 2.5,
        ("guest", "c"): 2.5,
        ("guest", UNASSIGNED): 2.5,
    }


def test_the_nearest_cohort_lends_first() -> None:
    builder = (
        ClusterBuilder()
        .pool("a100", nodes=4)
        .parent("org", quota={"a100": {"gpu": 24}})  # 8 of it assigned to no child
        .leaf("a", parent="org", quota={"a100": {"gpu": 8}})
        .leaf("b", parent="org", quota={"a100": {"gpu": 8}})
        .leaf("other", quota={"a100": {"gpu": 8}})
    )
    loans = given(builder, running("r1", "a", {"a100-00": 8, "a100-01": 4}))
    assert loans == {("a", "b"): 2.0, ("a", "org"): 2.0}  # other lends nothing


def test_a_lending_limit_keeps_its_part_back() -> None:
    builder = (
        ClusterBuilder()
        .pool("a100", nodes=2)
        .leaf("a", quota={"a100": {"gpu": 8}})
        .leaf("b", quota={"a100": {"gpu": 8}}, lending_limit={"a100": {"gpu": 2}})
    )
    loans = given(builder, running("r1", "a", {"a100-00": 8, "a100-01": 2}))
    assert loans == {("a", "b"): 2.0}
