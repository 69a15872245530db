"""What the loop asks an executor to start for one replica of an admitted job.

At launch the job is checked again against the cluster as it is now (a tenant's
allow-list or data scopes may have changed since it was submitted, and a link may lead
elsewhere): its image, its mounts (bound at their resolved paths) and its network. A
job that no longer passes fails with class ``image`` or ``data_access`` and runs
nothing. Every replica of an attempt gets the rendezvous environment of distributed
training (:func:`rendezvous_env`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allotment.domain.cluster import Cluster
from allotment.domain.errors import ConfigError
from allotment.domain.isolation import ImageNotAllowed, check_execution, job_image
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass
from allotment.domain.resources import CPU, MEMORY
from allotment.domain.scopes import resolve_mounts
from allotment.executors.base import Bind, ContainerSpec, Executor, LaunchRequest, ReplicaKey
from allotment.scheduler.snapshot import ReplicaPlacement
from allotment.store.allocations import placements_from_json
from allotment.store.layout import attempt_dir, log_path, logs_dir, make_private

PORT_BASE = 20_000
PORT_SPAN = 10_000
"""``MASTER_PORT`` is derived from the job and attempt inside [20000, 30000)."""


@dataclass(frozen=True, slots=True)
class LaunchFailure:
    """Why an attempt was not launched, and the failure class it ends with."""

    message: str
    failure: FailureClass


def master_port(job_id: str, attempt: int) -> int:
    """The rendezvous port of an attempt: stable (a relaunch after a crash gets the
    same) and spread over a range, so that jobs on one host rarely share one."""
    return PORT_BASE + zlib.crc32(f"{job_id}/{attempt}".encode()) % PORT_SPAN


def rendezvous_env(
    placements: Sequence[ReplicaPlacement],
    addresses: dict[str, str],
    *,
    port: int,
) -> list[dict[str, str]]:
    """For each replica, in order, what ``torch.distributed`` and its peers expect:
    ``WORLD_SIZE``, ``RANK`` (its position), ``NODE_RANK`` (its node's position among
    the attempt's nodes), ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (among the replicas
    on its node), ``MASTER_ADDR`` and ``MASTER_PORT`` (rank 0's node), and
    ``ALLOTMENT_PEERS`` (every rank's address, in rank order) and ``ALLOTMENT_NODES``
    (the attempt's nodes, in node-rank order)."""
    nodes: list[str] = []
    for placement in placements:
        if placement.node not in nodes:
            nodes.append(placement.node)
    per_node = {node: [p for p in placements if p.node == node] for node in nodes}
    peers = ",".join(addresses.get(p.node, p.node) for p in placements)
    master = addresses.get(placements[0].node, placements[0].node) if placements else ""
    out = []
    for rank, placement in enumerate(placements):
        local = per_node[placement.node]
        out.append(
            {
                "WORLD_SIZE": str(len(placements)),
                "RANK": str(rank),
                "NODE_RANK": str(nodes.index(placement.node)),
                "NNODES": str(len(nodes)),
                "LOCAL_RANK": str(local.index(placement)),
                "LOCAL_WORLD_SIZE": str(len(local)),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(port),
                "ALLOTMENT_PEERS": peers,
                "ALLOTMENT_NODES": ",".join(nodes),
            }
        )
    return out


def _failure_of(path: str) -> FailureClass:
    """The failure class of a launch refused for the field at ``path``."""
    if path.startswith("mounts"):
        return FailureClass.DATA_ACCESS
    if path.startswith("image"):
        return FailureClass.IMAGE
    return FailureClass.RESOURCES


def container_spec(
    cluster: Cluster, spec: JobSpec, tenant: str
) -> tuple[ContainerSpec | None, LaunchFailure | None]:
    """The container a job's replicas run in (``None`` with plain processes), checked
    against the cluster as it is now; or why it may not run."""
    queue = cluster.queues.get(spec.queue)
    if queue is not None:
        try:
            check_execution(spec, cluster, queue, tenant)
        except ImageNotAllowed as exc:
            return None, LaunchFailure(exc.issues[0].message, FailureClass.IMAGE)
        except ConfigError as exc:
            return None, LaunchFailure(
                "; ".join(i.message for i in exc.issues), _failure_of(exc.issues[0].path)
            )
    declared = cluster.tenants.get(tenant)
    scopes = list(declared.data_scopes) if declared is not None else []
    allowed, issues = resolve_mounts(spec.mounts, scopes, tenant=tenant)
    if issues:
        message = "mounts refused at launch: " + "; ".join(i.message for i in issues)
        return None, LaunchFailure(message, FailureClass.DATA_ACCESS)
    if not cluster.runtime.containers:
        return None, None
    image = job_image(spec, cluster)
    if image is None:
        return None, LaunchFailure("no image to run (and no default image)", FailureClass.IMAGE)
    uid = cluster.uid_of(tenant)
    binds = []
    for source, mount in allowed:
        if "://" in source:
            message = f"mount {mount.source!r}: object-store sources cannot be bind-mounted"
            return None, LaunchFailure(message, FailureClass.DATA_ACCESS)
        binds.append(Bind(source=source, target=mount.target, read_only=mount.read_only))
    container = ContainerSpec(
        image=image,
        uid=uid,
        gid=uid,
        binds=tuple(binds),
        shm_bytes=spec.shm or cluster.runtime.shm,
        network=spec.network,
        tenant=tenant,
    )
    return container, None


def launch_request(
    work_root: Path,
    job_id: str,
    tenant: str,
    spec: JobSpec,
    number: int,
    placement: ReplicaPlacement,
    *,
    container: ContainerSpec | None = None,
    rendezvous: dict[str, str] | None = None,
) -> LaunchRequest:
    """The launch of one replica of attempt ``number``: its command and environment
    (the job's, the rendezvous variables, plus ``ALLOTMENT_JOB_ID``, ``_ATTEMPT``,
    ``_REPLICA``, ``_REPLICA_INDEX``), devices, limits, container, and its working and
    log paths under the tenant's private area (created here, mode 0700)."""
    workdir = attempt_dir(work_root, tenant, job_id, number)
    make_private(work_root, logs_dir(work_root, tenant, job_id, number))
    where = (work_root, tenant, job_id, number, placement.group, placement.index)
    memory = placement.resources.get(MEMORY, 0) // 1000
    cpu = placement.resources.get(CPU, 0)
    env = {
        **spec.env,
        **(rendezvous or {}),
        "ALLOTMENT_JOB_ID": job_id,
        "ALLOTMENT_ATTEMPT": str(number),
        "ALLOTMENT_REPLICA": placement.group,
        "ALLOTMENT_REPLICA_INDEX": str(placement.index),
    }
    return LaunchRequest(
        job_id=job_id,
        attempt=number,
        replica=placement.group,
        index=placement.index,
        command=list(spec.command),
        env=env,
        workdir=workdir,
        stdout_path=log_path(*where, "out"),
        stderr_path=log_path(*where, "err"),
        devices=placement.devices,
        cpu_millis=cpu or None,
        memory_bytes=memory or None,
        max_runtime=spec.max_runtime,
        node=placement.node,
        container=container,
    )


def launch_attempt(
    executor: Executor,
    cluster: Cluster,
    work_root: Path,
    job_id: str,
    tenant: str,
    spec: JobSpec,
    number: int,
    allocation: list[Any],
) -> LaunchFailure | None:
    """Launch every replica of an admitted attempt together (idempotent); what went
    wrong, or ``None``."""
    if not spec.command:
        return LaunchFailure("the job has no command", FailureClass.USER_CODE)
    container, refused = container_spec(cluster, spec, tenant)
    if refused is not None:
        return refused
    placements = placements_from_json(allocation)
    addresses = {p.node: executor.address(p.node) for p in placements}
    envs = rendezvous_env(placements, addresses, port=master_port(job_id, number))
    try:
        executor.launch_all(
            [
                launch_request(
                    work_root,
                    job_id,
                    tenant,
                    spec,
                    number,
                    placement,
                    container=container,
                    rendezvous=env,
                )
                for placement, env in zip(placements, envs, strict=True)
            ]
        )
    except OSError as exc:
        return LaunchFailure(f"launch failed: {exc}", FailureClass.RESOURCES)
    return None


def replica_keys(job_id: str, attempt: int, allocation: Sequence[Any]) -> list[ReplicaKey]:
    """The executor keys of every replica of an attempt."""
    return [ReplicaKey(job_id, attempt, p.group, p.index) for p in placements_from_json(allocation)]
