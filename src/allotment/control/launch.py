"""What the loop asks an executor to start for one replica of an admitted job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from allotment.control.allocations import placements_from_json
from allotment.control.layout import attempt_dir, log_path, logs_dir, make_private
from allotment.domain.job import JobSpec
from allotment.domain.resources import CPU, MEMORY
from allotment.executors.base import Executor, LaunchRequest
from allotment.scheduler.snapshot import ReplicaPlacement


def launch_request(
    work_root: Path,
    job_id: str,
    tenant: str,
    spec: JobSpec,
    number: int,
    placement: ReplicaPlacement,
) -> LaunchRequest:
    """The launch of one replica of attempt ``number``: its command and environment
    (the job's, plus ``ALLOTMENT_JOB_ID``, ``_ATTEMPT``, ``_REPLICA``, ``_REPLICA_INDEX``),
    devices, limits, and its working and log paths under the tenant's private area
    (created here, mode 0700)."""
    workdir = attempt_dir(work_root, tenant, job_id, number)
    make_private(work_root, logs_dir(work_root, tenant, job_id, number))
    where = (work_root, tenant, job_id, number, placement.group, placement.index)
    memory = placement.resources.get(MEMORY, 0) // 1000
    cpu = placement.resources.get(CPU, 0)
    env = {
        **spec.env,
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
    )


def launch_attempt(
    executor: Executor,
    work_root: Path,
    job_id: str,
    tenant: str,
    spec: JobSpec,
    number: int,
    allocation: list[Any],
) -> str | None:
    """Launch every replica of an admitted attempt together (idempotent); what went
    wrong, or ``None``."""
    if not spec.command:
        return "the job has no command"
    placements = placements_from_json(allocation)
    try:
        executor.launch_all(
            [launch_request(work_root, job_id, tenant, spec, number, p) for p in placements]
        )
    except OSError as exc:
        return f"launch failed: {exc}"
    return None
