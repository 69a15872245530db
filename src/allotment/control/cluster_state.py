"""The one owner of the cluster as it is now.

A server holds one :class:`ClusterState` and hands it to the API, the control loop and
the webhooks. It holds the applied configuration together with the nodes the executor
reports (Slurm's inventory and health), as one immutable
:class:`~allotment.domain.cluster.Cluster`, and a version that goes up with every
change. Writers call :meth:`ClusterState.apply` (a new configuration) or
:meth:`ClusterState.take_nodes` (the executor's nodes changed); readers take
:meth:`ClusterState.current`, or :meth:`ClusterState.snapshot` to learn whether
anything changed since they last looked. The control loop reads the version at the
start of each turn and rebuilds its scheduler session when it moved; nobody pushes a
cluster into anybody else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from allotment.domain.cluster import Cluster, Node

log = logging.getLogger(__name__)

NodesOf = Callable[[Cluster], dict[str, Node] | None]
"""The executor's nodes for a configuration (None: it does not report nodes, or the
call failed and the nodes in use stand)."""


class ClusterState:
    """The cluster in use and its version; safe to share between threads."""

    def __init__(self, cluster: Cluster, *, nodes_of: NodesOf | None = None) -> None:
        self._cluster = cluster
        self._version = 0
        self._nodes_of = nodes_of
        self._lock = threading.Lock()

    @classmethod
    def of(cls, cluster: Cluster | ClusterState) -> ClusterState:
        """``cluster`` itself when it is a state already, else a state holding it."""
        return cluster if isinstance(cluster, ClusterState) else cls(cluster)

    def current(self) -> Cluster:
        """The cluster in use now (immutable: keep it for a whole turn or request)."""
        return self._cluster

    @property
    def version(self) -> int:
        return self._version

    def snapshot(self) -> tuple[int, Cluster]:
        """The version and the cluster, taken together."""
        with self._lock:
            return self._version, self._cluster

    def apply(self, new: Cluster) -> None:
        """A new configuration is in use from now on. Where the executor reports its
        nodes, the new configuration runs on them (asked before the change, so that
        nobody sees the configuration without them)."""
        new = self.resolve(new)
        with self._lock:
            self._cluster = new
            self._version += 1

    def resolve(self, config: Cluster) -> Cluster:
        """``config`` as it would run here: on the executor's nodes where it reports
        them (a proposed or past configuration, for a replay); nothing changes."""
        nodes = self._nodes_of(config) if self._nodes_of is not None else None
        return config if nodes is None else config.with_nodes(nodes)

    def refresh_nodes(self) -> bool:
        """Ask the executor for its nodes now and take them; whether they changed
        anything. An executor briefly unreachable is logged, and the nodes in use stand
        until the next time."""
        if self._nodes_of is None:
            return False
        try:
            nodes = self._nodes_of(self.current())
        except Exception:
            log.exception("reading the executor's nodes failed")
            return False
        return nodes is not None and self.take_nodes(nodes)

    def take_nodes(self, nodes: dict[str, Node]) -> bool:
        """The executor's nodes, on the configuration in use (one applied meanwhile
        included); whether they changed anything."""
        with self._lock:
            new = self._cluster.with_nodes(nodes)
            if new.nodes == self._cluster.nodes:
                return False
            self._cluster = new
            self._version += 1
            return True
