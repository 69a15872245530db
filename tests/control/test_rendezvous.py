"""The rendezvous environment of an attempt's replicas (``torch.distributed``'s ranks,
node ranks, local ranks, master address and port)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.control.launch import PORT_BASE, PORT_SPAN, master_port, rendezvous_env
from allotment.scheduler.snapshot import ReplicaPlacement

ADDRESSES = {"n1": "10.0.0.1", "n2": "10.0.0.2"}


def placement(index: int, node: str, group: str = "worker") -> ReplicaPlacement:
    return ReplicaPlacement(group=group, index=index, node=node, resources={"gpu": 1000})


def test_two_nodes_with_two_replicas_each() -> None:
    # Interleaved on purpose: ranks follow the placements, node ranks the first
    # appearance of each node, local ranks the order on the node.
    placements = [placement(0, "n2"), placement(1, "n1"), placement(2, "n2"), placement(3, "n1")]
    envs = rendezvous_env(placements, ADDRESSES, port=23456)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0", "1", "1"]
    for env in envs:
        assert env["WORLD_SIZE"] == "4" and env["NNODES"] == "2"
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "10.0.0.2"  # rank 0's node
        assert env["MASTER_PORT"] == "23456"
        assert env["ALLOTMENT_PEERS"] == "10.0.0.2,10.0.0.1,10.0.0.2,10.0.0.1"
        assert env["ALLOTMENT_NODES"] == "n2,n1"


def test_groups_share_one_world() -> None:
    placements = [placement(0, "n1", "server"), placement(0, "n1"), placement(1, "n2")]
    envs = rendezvous_env(placements, ADDRESSES, port=20000)
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["2", "2", "1"]


def test_a_node_without_an_address_is_reached_by_its_name() -> None:
    [env] = rendezvous_env([placement(0, "gpu-17")], {}, port=20001)
    assert env["MASTER_ADDR"] == "gpu-17" and env["ALLOTMENT_PEERS"] == "gpu-17"
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"], env["NNODES"]) == (
        "1",
        "0",
        "0",
        "1",
    )


def test_no_placements_no_environment() -> None:
    assert rendezvous_env([], ADDRESSES, port=20000) == []


def test_the_master_port_is_stable_and_in_range() -> None:
    ports = {master_port(f"j{i}", attempt) for i in range(200) for attempt in (1, 2)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert master_port("j1", 1) == master_port("j1", 1)
    assert len(ports) > 300  # spread: 400 attempts rarely share a port


NODES = ["n1", "n2", "n3", "n4"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(NODES), min_size=1, max_size=40))
def test_ranks_are_a_permutation_and_local_ranks_unique_per_node(nodes: list[str]) -> None:
    placements = [placement(i, node) for i, node in enumerate(nodes)]
    addresses = {node: f"addr-{node}" for node in NODES}
    envs = rendezvous_env(placements, addresses, port=master_port("j", 1))
    size = len(placements)
    assert sorted(int(e["RANK"]) for e in envs) == list(range(size))
    assert {e["WORLD_SIZE"] for e in envs} == {str(size)}
    assert {e["MASTER_ADDR"] for e in envs} == {addresses[nodes[0]]}
    local: dict[str, list[int]] = defaultdict(list)
    node_ranks: dict[str, set[str]] = defaultdict(set)
    for env, node in zip(envs, nodes, strict=True):
        local[node].append(int(env["LOCAL_RANK"]))
        node_ranks[node].add(env["NODE_RANK"])
        assert int(env["LOCAL_WORLD_SIZE"]) == nodes.count(node)
        assert env["ALLOTMENT_NODES"].split(",")[int(env["NODE_RANK"])] == node
    for node, ranks in local.items():
        assert sorted(ranks) == list(range(len(ranks))), node
    # One node rank per node, and different nodes have different ones.
    assert all(len(r) == 1 for r in node_ranks.values())
    assert len({next(iter(r)) for r in node_ranks.values()}) == len(node_ranks)
    assert {e["NNODES"] for e in envs} == {str(len(node_ranks))}
