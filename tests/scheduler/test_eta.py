"""Start-time estimates by forward simulation of the same rules."""

from __future__ import annotations

from allotment.scheduler.eta import estimate_starts
from allotment.scheduler.snapshot import SchedulerPolicy, Snapshot

from .builders import NOW, ClusterBuilder, job, running


def test_estimates_follow_running_ends_and_queue_order() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=1).leaf("a", quota={"a100": {"gpu": 8}}).build()
    snapshot = Snapshot(
        now=NOW,
        cluster=cluster,
        policy=SchedulerPolicy(),
        running=[running("r", "a", "a100-00", gpu=8, end=NOW + 600)],
        pending=[
            job("j1", "a", gpu=8, submit=1, expected_runtime=1200),
            job("j2", "a", gpu=4, submit=2, max_runtime=300),
            job("j3", "a", gpu=8, submit=3),
        ],
    )
    estimates = estimate_starts(snapshot)
    assert estimates["j1"] == NOW + 600
    assert estimates["j2"] == NOW + 1800
    assert estimates["j3"] == NOW + 2100


def test_unknown_runtime_gives_no_estimate() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=1).leaf("a", quota={"a100": {"gpu": 8}}).build()
    snapshot = Snapshot(
        now=NOW,
        cluster=cluster,
        running=[running("r", "a", "a100-00", gpu=8)],
        pending=[job("j", "a", gpu=8)],
    )
    assert estimate_starts(snapshot) == {"j": None}


def test_window_opening_is_a_change() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .leaf(
            "n",
            quota={"a100": {"gpu": 8}},
            time_windows=[{"days": "mon-sun", "from": "20:00", "to": "06:00"}],
        )
        .build()
    )
    snapshot = Snapshot(now=NOW, cluster=cluster, pending=[job("j", "n")])
    assert estimate_starts(snapshot) == {"j": NOW + 12 * 3600}
