"""Gangs are all or nothing; multi-replica jobs are packed compactly; devices chosen."""

from __future__ import annotations

from .builders import ClusterBuilder, admitted, codes, cycle, job, running


def test_gang_waits_when_not_all_replicas_fit() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=2).leaf("a", quota={"a100": {"gpu": 32}}).build()
    decisions = cycle(
        cluster, [job("gang", "a", gpu=8, replicas=2)], [running("r", "a", "a100-00", gpu=2)]
    )
    assert admitted(decisions) == []
    reason = decisions.waiting["gang"]
    assert reason.code.value == "gang_unsatisfiable"
    assert reason.detail["placeable"] == 1 and reason.detail["replicas"] == 2


def test_gang_starts_whole() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=2).leaf("a", quota={"a100": {"gpu": 16}}).build()
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)])
    (admit,) = decisions.admitted
    assert sorted(p.node for p in admit.placements) == ["a100-00", "a100-01"]
    assert all(p.devices == tuple(range(8)) for p in admit.placements)


def test_small_gang_packs_on_one_node() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=2).leaf("a", quota={"a100": {"gpu": 16}}).build()
    decisions = cycle(cluster, [job("gang", "a", gpu=2, replicas=3)])
    (admit,) = decisions.admitted
    assert {p.node for p in admit.placements} == {"a100-00"}
    devices = sorted(d for p in admit.placements for d in p.devices)
    assert devices == [0, 1, 2, 3, 4, 5]


def test_gang_prefers_one_rack() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=4, racks=2)
        .leaf("a", quota={"a100": {"gpu": 32}})
        .build()
    )
    # rack r0 = nodes 00, 01; r1 = nodes 02, 03. Node 00 is partly busy, so r0 cannot hold
    # two 8-GPU replicas, r1 can.
    decisions = cycle(
        cluster, [job("gang", "a", gpu=8, replicas=2)], [running("r", "a", "a100-00", gpu=1)]
    )
    (admit,) = decisions.admitted
    assert sorted(p.node for p in admit.placements) == ["a100-02", "a100-03"]


def test_best_fit_uses_the_fullest_node() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=3).leaf("a", quota={"a100": {"gpu": 24}}).build()
    runs = [running("r0", "a", "a100-00", gpu=2), running("r1", "a", "a100-01", gpu=6)]
    decisions = cycle(cluster, [job("j", "a", gpu=2)], runs)
    (admit,) = decisions.admitted
    assert admit.placements[0].node == "a100-01"
    assert admit.placements[0].devices == (6, 7)


def test_cpu_and_memory_are_checked_too() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=1, cpu=16, memory="64Gi")
        .leaf("a", quota={"a100": {"gpu": 8}})
        .build()
    )
    decisions = cycle(cluster, [job("big-mem", "a", gpu=1, memory="128Gi")])
    assert codes(decisions) == {"big-mem": "no_node_fits"}
    assert decisions.waiting["big-mem"].detail["permanent"] is True
    decisions = cycle(
        cluster, [job("j", "a", gpu=1, cpu=12)], [running("r", "a", "a100-00", gpu=1, cpu=8)]
    )
    assert codes(decisions) == {"j": "no_node_fits"}
    assert decisions.waiting["j"].detail["largest_free"]["cpu"] == "8"


def test_fractional_gpus_share_a_device() -> None:
    cluster = (
        ClusterBuilder().pool("t4", nodes=1, gpu=2).leaf("a", quota={"t4": {"gpu": 2}}).build()
    )
    decisions = cycle(
        cluster,
        [job("h1", "a", gpu=0.5, submit=1), job("h2", "a", gpu=0.5, submit=2)],
        [running("r", "a", "t4-00", gpu=1, first_device=0)],
    )
    assert admitted(decisions) == ["h1", "h2"]
    assert [a.placements[0].devices for a in decisions.admitted] == [(1,), (1,)]


def test_pool_preference_order() -> None:
    cluster = (
        ClusterBuilder()
        .pool("h100", nodes=1)
        .pool("a100", nodes=1)
        .leaf("a", quota={"h100": {"gpu": 8}, "a100": {"gpu": 8}})
        .build()
    )
    decisions = cycle(cluster, [job("j", "a", gpu=4, pools=["a100", "h100"])])
    assert decisions.admitted[0].pool == "a100"
    decisions = cycle(
        cluster,
        [job("j", "a", gpu=4, pools=["a100", "h100"])],
        [running("r", "a", "a100-00", gpu=6)],
    )
    assert decisions.admitted[0].pool == "h100"


def test_unhealthy_nodes_are_not_used() -> None:
    builder = ClusterBuilder().pool("a100", nodes=2).leaf("a", quota={"a100": {"gpu": 16}})
    builder.data["nodes"][0]["healthy"] = False
    decisions = cycle(
        builder.build(), [job("j1", "a", gpu=8, submit=1), job("j2", "a", gpu=8, submit=2)]
    )
    assert [a.placements[0].node for a in decisions.admitted] == ["a100-01"]
