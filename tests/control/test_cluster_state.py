"""The one owner of the cluster in use: versions, nodes from the executor, readers."""

from __future__ import annotations

from allotment.control.cluster_state import ClusterState
from allotment.domain.cluster import Cluster, Node
from allotment.domain.loading import load_cluster
from tests.api.conftest import EXAMPLES


def local() -> Cluster:
    return load_cluster(EXAMPLES / "cluster-local.yaml")


def test_every_change_raises_the_version_and_a_no_op_does_not() -> None:
    cluster = local()
    state = ClusterState(cluster)
    assert state.snapshot() == (0, cluster)
    assert not state.take_nodes(dict(cluster.nodes))  # the same nodes: nothing changed
    assert state.version == 0
    down = {n: node.model_copy(update={"healthy": False}) for n, node in cluster.nodes.items()}
    assert state.take_nodes(down)
    version, now = state.snapshot()
    assert version == 1 and not now.nodes["localhost"].healthy
    assert now.queues is cluster.queues  # the configuration in use is kept
    state.apply(local())
    assert state.version == 2 and state.current().nodes["localhost"].healthy


def test_a_new_configuration_runs_on_the_nodes_the_executor_reports() -> None:
    """With an executor that reports its nodes (Slurm), nobody ever sees a configuration
    without them: they are asked for before the change."""
    template = local().nodes["localhost"]
    reported = {"gpu-01": template.model_copy(update={"name": "gpu-01"})}
    asked: list[Cluster] = []

    def nodes_of(cluster: Cluster) -> dict[str, Node]:
        asked.append(cluster)
        return reported

    state = ClusterState(local(), nodes_of=nodes_of)
    new = local()
    state.apply(new)
    assert asked == [new]
    assert list(state.current().nodes) == ["gpu-01"]
    assert state.current().queues is new.queues


def test_of_shares_a_state_and_wraps_a_cluster() -> None:
    state = ClusterState(local())
    assert ClusterState.of(state) is state
    cluster = local()
    assert ClusterState.of(cluster).current() is cluster


def test_refresh_asks_the_executor_and_keeps_the_nodes_when_it_fails() -> None:
    cluster = local()
    answers: list[dict[str, Node] | Exception] = []

    def nodes_of(_cluster: Cluster) -> dict[str, Node]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    state = ClusterState(cluster, nodes_of=nodes_of)
    down = {n: node.model_copy(update={"healthy": False}) for n, node in cluster.nodes.items()}
    answers.extend([OSError("sinfo timed out"), down, down])
    assert not state.refresh_nodes()  # unreachable: logged, the nodes in use stand
    assert state.version == 0 and state.current().nodes["localhost"].healthy
    assert state.refresh_nodes() and not state.current().nodes["localhost"].healthy
    assert not state.refresh_nodes()  # nothing changed
    assert not ClusterState(cluster).refresh_nodes()  # no executor that reports nodes
