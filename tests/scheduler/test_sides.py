"""Borrowers and owners kept apart on a pool's nodes, so that reclaim frees whole nodes.

A job of a queue with no guaranteed GPUs in a pool (a guest there) prefers nodes without
the pool's own jobs, and an owner's job nodes without guests, even over a tighter fit.
"""

from __future__ import annotations

from allotment.scheduler.snapshot import SchedulerPolicy

from .builders import ClusterBuilder, admitted, cycle, job, running, victims


def two_pools() -> ClusterBuilder:
    """Each queue owns one pool of two 8-GPU nodes and may borrow the other's."""
    return (
        ClusterBuilder()
        .pool("pa", nodes=2)
        .pool("pb", nodes=2)
        .leaf("a", quota={"pa": {"gpu": 16}})
        .leaf("b", quota={"pb": {"gpu": 16}})
    )


# b fills its own pool; a runs 4 GPUs on pa-00.
FULL_B = [
    running("b0", "b", "pb-00", gpu=8),
    running("b1", "b", "pb-01", gpu=8),
    running("a0", "a", "pa-00", gpu=4),
]


def node_of(decisions: object, job_id: str) -> str:
    admit = next(a for a in decisions.admitted if a.job == job_id)  # type: ignore[attr-defined]
    return str(admit.placements[0].node)


def test_a_guest_goes_to_a_node_without_owners_even_if_a_tighter_one_fits() -> None:
    decisions = cycle(two_pools().build(), [job("guest", "b", gpu=1)], FULL_B)
    assert admitted(decisions) == ["guest"]
    assert node_of(decisions, "guest") == "pa-01"  # pa-00 is tighter, but a's


def test_an_owner_goes_to_a_node_without_guests() -> None:
    runs = [*FULL_B[:2], running("g", "b", "pa-00", pool="pa", gpu=4)]
    decisions = cycle(two_pools().build(), [job("own", "a", gpu=1)], runs)
    assert node_of(decisions, "own") == "pa-01"


def test_when_only_a_mixed_node_fits_it_is_used() -> None:
    runs = [*FULL_B, running("a1", "a", "pa-01", gpu=8)]
    decisions = cycle(two_pools().build(), [job("guest", "b", gpu=2)], runs)
    assert node_of(decisions, "guest") == "pa-00"


def test_without_borrowing_placement_is_plain_best_fit() -> None:
    cluster = two_pools().leaf("c", quota={"pa": {"gpu": 1}}).build()
    policy = SchedulerPolicy(borrowing=False)
    decisions = cycle(cluster, [job("c1", "c", gpu=1)], FULL_B, policy=policy)
    assert node_of(decisions, "c1") == "pa-00"


def test_reclaim_frees_a_whole_node_by_evicting_only_guests() -> None:
    """Guests were packed together, so the owner's 8-GPU job evicts them and no more."""
    cluster = two_pools().build()
    state = list(FULL_B)
    for i in range(4):  # four 1-GPU guests arrive one by one
        decisions = cycle(cluster, [job(f"g{i}", "b", gpu=1)], state)
        node = node_of(decisions, f"g{i}")
        state.append(running(f"g{i}", "b", node, pool="pa", gpu=1, first_device=i))
    assert {r.placements[0].node for r in state if r.id.startswith("g")} == {"pa-01"}
    decisions = cycle(cluster, [job("big", "a", gpu=8)], state)
    assert sorted(victims(decisions)["big"]) == ["g0", "g1", "g2", "g3"]
