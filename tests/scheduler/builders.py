"""Small fluent builders for scheduler tests: a cluster in a few calls, jobs in one."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import pytest
import yaml

from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.domain.resources import Resources
from allotment.scheduler import COMPILED
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.snapshot import (
    PendingJob,
    ReplicaPlacement,
    ReplicaRequest,
    RunningJob,
    SchedulerPolicy,
    Snapshot,
)

_Test = TypeVar("_Test", bound=Callable[..., Any])


def patches_core(test: _Test) -> _Test:
    """For a test that patches the core's internals to count or change its steps: compiled
    code calls its own functions directly and never sees a patch, so the test runs where
    the core runs from its sources, and ``test_compiled.py`` runs it there when here the
    core is compiled."""
    skip = pytest.mark.skipif(COMPILED, reason="the core is compiled: run by test_compiled.py")
    marked: _Test = pytest.mark.patches_core(skip(test))
    return marked


NOW = 1_767_600_000.0  # a Monday, 08:00 UTC (2026-01-05)


class ClusterBuilder:
    """``ClusterBuilder().pool("a100", nodes=2).leaf("a", quota={"a100": {"gpu": 8}})``."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"pools": [], "nodes": [], "queues": []}
        self._parents: dict[str, dict[str, Any]] = {}

    def pool(
        self,
        name: str,
        *,
        nodes: int = 1,
        gpu: int = 8,
        cpu: int = 64,
        memory: str = "512Gi",
        racks: int = 1,
        **extra: Any,
    ) -> ClusterBuilder:
        self.data["pools"].append({"name": name, **extra})
        per_rack = max(1, nodes // racks)
        for i in range(nodes):
            self.data["nodes"].append(
                {
                    "name": f"{name}-{i:02d}",
                    "pool": name,
                    "capacity": {"gpu": gpu, "cpu": cpu, "memory": memory},
                    "topology": {"rack": f"r{min(i // per_rack, racks - 1)}"},
                }
            )
        return self

    def classes(self, *specs: Mapping[str, Any]) -> ClusterBuilder:
        self.data["priority_classes"] = [dict(s) for s in specs]
        return self

    def parent(self, name: str, *, parent: str | None = None, **fields: Any) -> ClusterBuilder:
        node = {"name": name, **fields, "children": []}
        self._parents[name] = node
        self._attach(node, parent)
        return self

    def leaf(self, name: str, *, parent: str | None = None, **fields: Any) -> ClusterBuilder:
        self._attach({"name": name, **fields}, parent)
        return self

    def _attach(self, node: dict[str, Any], parent: str | None) -> None:
        if parent is None:
            self.data["queues"].append(node)
        else:
            self._parents[parent]["children"].append(node)

    def build(self) -> Cluster:
        return load_cluster_text(yaml.safe_dump(self.data), source="test")


def two_owned_pools() -> Cluster:
    """Pool a100 (one 8-GPU node) is queue a's, pool v100 (two 4-GPU nodes) queue b's:
    8 GPUs guaranteed each, nothing to anyone else."""
    return (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .pool("v100", nodes=2, gpu=4)
        .leaf("a", quota={"a100": {"gpu": 8}})
        .leaf("b", quota={"v100": {"gpu": 8}})
        .build()
    )


def res(**units: Any) -> dict[str, int]:
    return Resources.parse(units).as_dict()


def job(
    job_id: str,
    queue: str,
    *,
    gpu: float = 1,
    cpu: float = 1,
    memory: str = "1Gi",
    replicas: int = 1,
    prio: str = "training",
    submit: float = NOW - 60,
    pools: Iterable[str] = (),
    max_runtime: float | None = None,
    expected_runtime: float | None = None,
    not_before: float | None = None,
    preempting: Iterable[str] = (),
) -> PendingJob:
    return PendingJob(
        id=job_id,
        queue=queue,
        priority_class=prio,
        submit_time=submit,
        replicas=(ReplicaRequest(count=replicas, resources=res(gpu=gpu, cpu=cpu, memory=memory)),),
        pools=tuple(pools),
        max_runtime=max_runtime,
        expected_runtime=expected_runtime,
        not_before=not_before,
        preempting=tuple(preempting),
    )


def running(
    job_id: str,
    queue: str,
    nodes: Mapping[str, float] | str,
    *,
    pool: str | None = None,
    gpu: float = 1,
    cpu: float = 1,
    memory: str = "1Gi",
    prio: str = "training",
    start: float = NOW - 600,
    end: float | None = None,
    terminating: bool = False,
    first_device: int = 0,
) -> RunningJob:
    """A running job: ``nodes`` is a node name (one replica of ``gpu``) or a mapping from
    node to GPUs on it (one replica per entry)."""
    spread = {nodes: gpu} if isinstance(nodes, str) else dict(nodes)
    placements = []
    for i, (node, gpus) in enumerate(spread.items()):
        whole = int(gpus) if gpus >= 1 else 0
        devices = tuple(range(first_device, first_device + whole)) if whole else (first_device,)
        placements.append(
            ReplicaPlacement(
                group="worker",
                index=i,
                node=node,
                resources=res(gpu=gpus, cpu=cpu, memory=memory),
                devices=devices if gpus else (),
            )
        )
    first = next(iter(spread))
    return RunningJob(
        id=job_id,
        queue=queue,
        priority_class=prio,
        pool=pool or first.rsplit("-", 1)[0],
        start_time=start,
        placements=tuple(placements),
        expected_end=end,
        terminating=terminating,
    )


def cycle(
    cluster: Cluster,
    pending: Iterable[PendingJob] = (),
    runs: Iterable[RunningJob] = (),
    *,
    now: float = NOW,
    policy: SchedulerPolicy | None = None,
) -> Decisions:
    return schedule_once(
        Snapshot(
            now=now,
            cluster=cluster,
            pending=list(pending),
            running=list(runs),
            policy=policy or SchedulerPolicy(),
        )
    )


def admitted(decisions: Decisions) -> list[str]:
    return [a.job for a in decisions.admitted]


def codes(decisions: Decisions) -> dict[str, str]:
    return {job: reason.code.value for job, reason in decisions.waiting.items()}


def victims(decisions: Decisions) -> dict[str, list[str]]:
    return {p.job: sorted(v.job for v in p.victims) for p in decisions.preemptions}
