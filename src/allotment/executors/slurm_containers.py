"""Containers on Slurm: what the server prepares before ``sbatch`` (each replica's
environment file and working directory), and what is enforced where."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from allotment.domain.executor import RuntimeSpec
from allotment.executors.base import LaunchRequest
from allotment.executors.containers import PROCESS_ENFORCEMENT, hand_over, require_containers
from allotment.executors.slurm_script import (
    KILL_AFTER_S,
    ContainerPlan,
    container_run,
    env_file_path,
)


def plan_containers(
    runtime: RuntimeSpec,
    requests: Sequence[LaunchRequest],
    slurm_dir: Path,
    kill_wait: Callable[[], float | None],
) -> ContainerPlan:
    """Write every replica's environment file (mode 0600) in ``slurm_dir``, hand the
    working directories to their tenants' uids, and return how the launcher runs the
    containers: killed after half of Slurm's ``KillWait`` (``kill_wait()``, asked only
    once all else is ready) when Slurm itself cancels the job. Raises ``OSError`` on
    a plain-process runtime and ``ValueError`` for a value no container can be given
    (a line break) or a gang mixing replicas with and without a container."""
    require_containers(runtime)
    runs = {}
    for request in requests:
        if request.container is None:
            raise ValueError(f"replica {request.key} has no container, unlike its gang")
        run = container_run(runtime, request, str(slurm_dir))
        hand_over(request, run, Path(env_file_path(str(slurm_dir), request.key)))
        runs[request.key] = run
    wait = kill_wait()
    kill_after = KILL_AFTER_S if wait is None else max(1.0, wait / 2)
    return ContainerPlan(
        runtime=runtime, directory=str(slurm_dir), runs=runs, kill_after=kill_after
    )


def slurm_enforcement(probed: Mapping[str, str] | None) -> dict[str, str]:
    """What a Slurm cluster enforces: with containers, what the server's probe found
    (``probed``) as each node's Podman applies it; with plain processes, what Slurm's
    own plugins do."""
    if probed is None:
        return {
            **PROCESS_ENFORCEMENT,
            "memory": "by Slurm (--mem) where its task/cgroup plugin constrains memory",
            "cpu": "by Slurm (--cpus-per-task) where its task/cgroup plugin constrains cores",
            "identity": "NOT enforced: every replica runs as Slurm runs this server's jobs",
            "devices": (
                "the GPUs Slurm bound (CUDA_VISIBLE_DEVICES; device cgroups only with "
                "ConstrainDevices=yes)"
            ),
        }
    return {
        **probed,
        "memory": (
            "enforced by Podman on each node (--memory, --memory-swap; OOM kills classed "
            "oom), inside Slurm's --mem; needs the nodes' cgroup memory controller"
        ),
        "cpu": (
            "enforced by Podman on each node (--cpus, CFS quota); needs the nodes' cgroup "
            "cpu controller"
        ),
        "devices": (
            "enforced: only the GPUs Slurm bound to the replica (--device or CDI), "
            "renumbered from 0"
        ),
    }
