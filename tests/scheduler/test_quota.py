"""Quota: nominal limits, borrowing and lending through the tree, reasons with numbers."""

from __future__ import annotations

import pytest

from allotment.scheduler.snapshot import SchedulerPolicy

from .builders import ClusterBuilder, admitted, codes, cycle, job, running


def two_teams(**leaf_a: object) -> ClusterBuilder:
    return (
        ClusterBuilder()
        .pool("a100", nodes=4)
        .parent("org", quota={"a100": {"gpu": 32}})
        .leaf("a", parent="org", quota={"a100": {"gpu": 16}}, **leaf_a)
        .leaf("b", parent="org", quota={"a100": {"gpu": 16}})
    )


CASES = [
    # name, leaf-a settings, policy, pending, running, expected admitted, expected reasons
    (
        "within nominal",
        {},
        SchedulerPolicy(),
        [job("j1", "a", gpu=8), job("j2", "a", gpu=8)],
        [],
        ["j1", "j2"],
        {},
    ),
    (
        "borrows idle quota of sibling",
        {},
        SchedulerPolicy(),
        [
            job("j1", "a", gpu=8, submit=1),
            job("j2", "a", gpu=8, submit=2),
            job("j3", "a", gpu=8, submit=3),
        ],
        [],
        ["j1", "j2", "j3"],
        {},
    ),
    (
        "no borrowing: nominal is the limit",
        {},
        SchedulerPolicy(borrowing=False),
        [
            job("j1", "a", gpu=8, submit=1),
            job("j2", "a", gpu=8, submit=2),
            job("j3", "a", gpu=8, submit=3),
        ],
        [],
        ["j1", "j2"],
        {"j3": "quota_exhausted"},
    ),
    (
        "borrowing limit caps borrowing",
        {"borrowing_limit": {"a100": {"gpu": 4}}},
        SchedulerPolicy(),
        [
            job("j1", "a", gpu=8, submit=1),
            job("j2", "a", gpu=8, submit=2),
            job("j3", "a", gpu=4, submit=3),
            job("j4", "a", gpu=1, submit=4),
        ],
        [],
        ["j1", "j2", "j3"],
        {"j4": "quota_exhausted"},
    ),
    (
        "sibling's usage leaves nothing to borrow",
        {},
        SchedulerPolicy(),
        [job("j1", "a", gpu=8)],
        [
            running("r1", "a", "a100-00", gpu=8),
            running("r2", "a", "a100-01", gpu=8),
            running("r3", "b", "a100-02", gpu=8),
            running("r4", "b", "a100-03", gpu=8),
        ],
        [],
        {"j1": "quota_exhausted"},
    ),
    (
        "larger than quota could ever allow",
        {"borrowing_limit": {"a100": {"gpu": 0}}},
        SchedulerPolicy(),
        [job("j1", "a", gpu=8, replicas=3)],
        [],
        [],
        {"j1": "exceeds_queue_limit"},
    ),
    (
        "max_job",
        {"max_job": {"gpu": 4}},
        SchedulerPolicy(),
        [job("j1", "a", gpu=8)],
        [],
        [],
        {"j1": "exceeds_queue_limit"},
    ),
]


@pytest.mark.parametrize(
    ("leaf_a", "policy", "pending", "runs", "expected", "reasons"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_quota_table(leaf_a, policy, pending, runs, expected, reasons) -> None:  # type: ignore[no-untyped-def]
    decisions = cycle(two_teams(**leaf_a).build(), pending, runs, policy=policy)
    assert admitted(decisions) == expected
    assert codes(decisions) == reasons


def test_lending_limit_keeps_part_of_the_guarantee() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=4)
        .parent("org", quota={"a100": {"gpu": 32}})
        .leaf("a", parent="org", quota={"a100": {"gpu": 16}})
        .leaf("b", parent="org", quota={"a100": {"gpu": 16}}, lending_limit={"a100": {"gpu": 8}})
        .build()
    )
    jobs = [job(f"j{i}", "a", gpu=8, submit=i) for i in range(4)]
    decisions = cycle(cluster, jobs)
    assert admitted(decisions) == ["j0", "j1", "j2"]  # 16 own + 8 lent by b
    assert codes(decisions) == {"j3": "quota_exhausted"}


def test_quota_reason_names_the_numbers() -> None:
    cluster = two_teams().build()
    decisions = cycle(
        cluster,
        [job("j1", "a", gpu=8)],
        [
            running("r1", "a", "a100-00", gpu=8),
            running("r2", "a", "a100-01", gpu=6),
            running("r3", "b", "a100-02", gpu=8),
            running("r4", "b", "a100-03", gpu=8),
        ],
        policy=SchedulerPolicy(borrowing=False),
    )
    reason = decisions.waiting["j1"]
    assert reason.code.value == "quota_exhausted"
    assert reason.detail == {
        "queue": "a",
        "pool": "a100",
        "resource": "gpu",
        "requested": 8,
        "used": 14,
        "nominal": 16,
        "borrowable": 0,
    }
    assert reason.message == (
        "queue a: 8 gpu requested in pool a100, 14 of 16 nominal used, 0 borrowable"
    )


def test_borrowed_part_and_lender_recorded() -> None:
    cluster = two_teams().build()
    decisions = cycle(
        cluster,
        [job("j1", "a", gpu=8)],
        [running("r1", "a", "a100-00", gpu=8), running("r2", "a", "a100-01", gpu=4)],
    )
    (admit,) = decisions.admitted
    assert admit.borrowed == {"gpu": 4000}
    assert admit.lenders == ("b",)


def test_unnamed_resource_limited_only_by_capacity() -> None:
    cluster = two_teams().build()
    decisions = cycle(cluster, [job("cpu-only", "a", gpu=0, cpu=60)])
    assert admitted(decisions) == ["cpu-only"]


def test_queue_without_quota_in_pool_cannot_use_it_without_borrowing() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .pool("l40", nodes=1)
        .leaf("a", quota={"a100": {"gpu": 8}})
        .build()
    )
    decisions = cycle(
        cluster, [job("j1", "a", gpu=1, pools=["l40"])], policy=SchedulerPolicy(borrowing=False)
    )
    assert codes(decisions) == {"j1": "exceeds_queue_limit"}
    decisions = cycle(cluster, [job("j1", "a", gpu=1, pools=["l40"])])
    assert admitted(decisions) == ["j1"]
