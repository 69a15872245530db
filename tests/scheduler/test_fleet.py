"""A job that could never run on the fleet is known at submit, with what the largest
node has; one that could (in some acceptable pool) is not refused."""

from __future__ import annotations

from dataclasses import replace

from allotment.domain.loading import load_cluster_text
from allotment.domain.resources import Resources
from allotment.scheduler.fleet import FleetFit
from allotment.scheduler.snapshot import ReplicaRequest

from .builders import ClusterBuilder, cycle, job


def group(count: int, **units: object) -> ReplicaRequest:
    return ReplicaRequest(name="w", count=count, resources=Resources.parse(units).as_dict())


def fleet() -> FleetFit:
    cluster = (
        ClusterBuilder()
        .pool("small", nodes=2, gpu=4, cpu=32)
        .pool("big", nodes=1, gpu=8, cpu=64)
        .leaf("a", quota={"small": {"gpu": 8}})
        .build()
    )
    return FleetFit(cluster)


def test_a_gang_larger_than_the_pool_even_empty_is_refused() -> None:
    fit = fleet()
    problem = fit.problem([group(3, gpu=4)], ["small"])
    assert problem is not None
    assert "3 replicas can never all run at once on the nodes of pool small" in problem
    assert "the largest node, small-00, has 32 cpu, 4 gpu, 512Gi memory" in problem
    assert fit.problem([group(2, gpu=4)], ["small"]) is None
    assert fit.problem([group(3, gpu=4)], ["small", "big"]) is not None  # 2 and 2
    assert fit.problem([group(3, gpu=2)], ["small", "big"]) is None


def test_one_replica_larger_than_every_node_is_refused_naming_the_largest() -> None:
    problem = fleet().problem([group(1, gpu=2), group(1, gpu=16)], ["small", "big"])
    assert problem is not None
    assert "asks for 16 gpu, more than any node of pools small, big has" in problem
    assert "the largest node, big-00, has 64 cpu, 8 gpu, 512Gi memory" in problem


def test_a_resource_no_node_declares_is_named() -> None:
    problem = fleet().problem([group(1, gpu=1, gpu_memory="100Gi")], ["small", "big"])
    assert problem is not None
    assert "more than any node of pools small, big has: no node there declares gpu_memory" in (
        problem
    )
    assert "the largest node, big-00, has 64 cpu, 8 gpu, 512Gi memory" in problem


def test_groups_that_fit_alone_but_not_together_are_refused() -> None:
    fit = fleet()
    assert fit.problem([group(1, gpu=8), group(1, gpu=1)], ["big"]) is not None
    # All replicas of a job run in one pool: the 8-GPU one only fits "big".
    assert fit.problem([group(1, gpu=8), group(1, gpu=1)], ["big", "small"]) is not None
    assert fit.problem([group(1, gpu=4), group(1, gpu=4)], ["small"]) is None


def test_pools_without_nodes_refuse_nothing() -> None:
    assert fleet().problem([group(100, gpu=8)], ["elsewhere"]) is None


def test_gpu_memory_is_checked_per_device_not_against_the_node_total() -> None:
    cluster = load_cluster_text(
        "pools: [{name: p}]\n"
        "nodes: [{name: n, pool: p, capacity: {gpu: 2, gpu_memory: 160Gi, cpu: 32}}]\n"
        "queues: [{name: a}]\n",
        source="test",
    )
    fit = FleetFit(cluster)
    problem = fit.problem([group(1, gpu=1, gpu_memory="100Gi")], ["p"])
    assert problem is not None and "more than any node of pool p has" in problem
    assert fit.problem([group(1, gpu=2, gpu_memory="100Gi")], ["p"]) is None  # 2 x 80Gi
    assert fit.problem([group(1, gpu=1, gpu_memory="80Gi")], ["p"]) is None
    assert fit.problem([group(1, gpu=0.5, gpu_memory="81Gi")], ["p"]) is not None


def test_the_scheduler_places_gpu_memory_on_a_node_whose_devices_hold_it() -> None:
    cluster = load_cluster_text(
        "pools: [{name: p}]\n"
        "nodes:\n"
        "  - {name: small, pool: p, capacity: {gpu: 2, gpu_memory: 160Gi, cpu: 32}}\n"
        "  - {name: large, pool: p, capacity: {gpu: 2, gpu_memory: 240Gi, cpu: 32}}\n"
        "queues: [{name: a, quota: {p: {gpu: 4}}}]\n",
        source="test",
    )
    wants = replace(job("j", "a", memory="0"), replicas=(group(1, gpu=1, gpu_memory="100Gi"),))
    decisions = cycle(cluster, [wants])
    [admitted] = decisions.admitted
    assert {p.node for p in admitted.placements} == {"large"}
    too_big = replace(wants, id="k", replicas=(group(1, gpu=1, gpu_memory="121Gi"),))
    decisions = cycle(cluster, [too_big])
    assert decisions.waiting["k"].code.value == "no_node_fits"
    assert decisions.waiting["k"].detail.get("permanent") is True
