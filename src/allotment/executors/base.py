"""The executor contract: launch, stop, observe, inventory.

An executor runs replicas and reports what it sees; it never decides what an ending
means (the control loop does, with :func:`allotment.executors.failures.classify`).
Every action is keyed by :class:`ReplicaKey` (job, attempt, replica group, index) and is
idempotent on that key, so the control loop may repeat an action after a crash.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from allotment.domain.cluster import Cluster, Node


@dataclass(frozen=True, slots=True, order=True)
class ReplicaKey:
    """Identity of one replica of one attempt of a job."""

    job_id: str
    attempt: int
    replica: str
    index: int

    def __str__(self) -> str:
        return f"{self.job_id}/{self.attempt}/{self.replica}-{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Bind:
    """One host path bind-mounted into a container (``source`` already resolved and
    checked against the tenant's data scopes)."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSpec:
    """How a replica runs as a container: its image, the uid and gid it runs under, its
    binds (besides the working directory), the size of ``/dev/shm``, and whether it
    has the network."""

    image: str
    uid: int
    gid: int
    binds: tuple[Bind, ...] = ()
    shm_bytes: int = 64 << 20
    network: bool = False
    tenant: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    """Everything an executor needs to start one replica.

    ``devices`` are the node-local GPU indexes the replica holds (exported as
    ``CUDA_VISIBLE_DEVICES``). ``stdout_path``/``stderr_path`` default to files in the
    replica's own directory. ``cpu_millis`` and ``memory_bytes`` are limits applied where
    the executor can; ``max_runtime`` (seconds) ends the replica with SIGTERM, then
    SIGKILL after ``timeout_grace_s``.
    """

    job_id: str
    attempt: int
    replica: str = "worker"
    index: int = 0
    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: Path
    stdout_path: Path | None = None
    stderr_path: Path | None = None
    devices: tuple[int, ...] = ()
    cpu_millis: int | None = None
    memory_bytes: int | None = None
    max_runtime: float | None = None
    timeout_grace_s: float = 10.0
    node: str | None = None
    """The node the scheduler placed the replica on (executors of many nodes pin it)."""
    container: ContainerSpec | None = None
    """Run in this container (``None``: as a plain process)."""

    @property
    def key(self) -> ReplicaKey:
        return ReplicaKey(self.job_id, self.attempt, self.replica, self.index)


class ReplicaPhase(StrEnum):
    """What an executor sees of a replica."""

    STARTING = "starting"
    """Launched; the process is not known to be running yet."""
    RUNNING = "running"
    EXITED = "exited"
    """Ended on its own with ``exit_code``."""
    KILLED = "killed"
    """Ended by ``signal``."""
    LOST = "lost"
    """Its supervision vanished without recording an end; how it ended is unknown."""


ENDED = frozenset({ReplicaPhase.EXITED, ReplicaPhase.KILLED, ReplicaPhase.LOST})


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaStatus:
    """One observation of a replica. Times are Unix seconds."""

    phase: ReplicaPhase
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    oom: bool = False
    """The executor believes memory exhaustion ended it (best effort)."""
    timed_out: bool = False
    """The executor ended it for passing ``max_runtime``."""
    stop_requested: bool = False
    """It ended after :meth:`Executor.stop`."""
    image_error: bool = False
    """Its image could not be found, pulled or started (failure class ``image``)."""
    start_error: bool = False
    """Its command could not be started: no such program, not executable (failure class
    ``launch``)."""
    lingering: bool = False
    """``lost``, yet processes of it still run (its supervisor died, its program did
    not): it must be stopped, and its devices stay taken until it is gone."""
    detail: str = ""

    @property
    def over(self) -> bool:
        """Its run is over as far as its outcome goes (ended, or lost)."""
        return self.phase in ENDED

    @property
    def ended(self) -> bool:
        """Over, and nothing of it runs any more: its resources may be given again."""
        return self.phase in ENDED and not self.lingering


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One accelerator as an executor found it (``source``: ``nvml`` or ``declared``)."""

    index: int
    uuid: str | None = None
    model: str | None = None
    memory_bytes: int | None = None
    source: str = "declared"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaUsage:
    """What one live replica uses now: CPU in cores (averaged since the previous
    :meth:`Executor.usage` call; ``None`` on the first), resident memory in bytes, and
    the ids of its processes."""

    cpu_cores: float | None = None
    memory_bytes: int | None = None
    pids: tuple[int, ...] = ()


class Executor(ABC):
    """Runs replicas somewhere. Implementations must make every method idempotent."""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> str:
        """Start the replica unless one was already launched under ``request.key``;
        return its handle. Does not wait for the replica to start."""

    @abstractmethod
    def stop(self, key: ReplicaKey, grace_s: float) -> None:
        """Ask the replica to end: SIGTERM to its process group, SIGKILL after
        ``grace_s`` seconds. Does not block; a replica already ended or never launched
        is left alone."""

    @abstractmethod
    def observe(self) -> dict[ReplicaKey, ReplicaStatus]:
        """The current status of every replica this executor knows, ended ones
        included."""

    @abstractmethod
    def inventory(self) -> list[GpuInfo]:
        """The accelerators this executor can hand out."""

    def launch_all(self, requests: Sequence[LaunchRequest]) -> list[str]:
        """Start every replica of one attempt (a gang) together; idempotent like
        :meth:`launch`. Executors that run a gang as one unit override it."""
        return [self.launch(request) for request in requests]

    def address(self, node: str) -> str:
        """How replicas on other nodes reach ``node`` (``MASTER_ADDR`` of a gang)."""
        return node

    def nodes(self, cluster: Cluster) -> dict[str, Node] | None:
        """The nodes this executor reports for ``cluster``'s pools, with their health;
        ``None`` when the cluster file's nodes are the truth (the default)."""
        return None

    def check(self) -> list[str]:
        """Problems that keep this executor from working, each saying what to change
        (checked when the server starts)."""
        return []

    def images(self) -> dict[str, list[str]] | None:
        """The container images present, by node (``None``: this executor cannot tell)."""
        return None

    def enforcement(self) -> dict[str, str]:
        """What isolation this executor enforces, by aspect (``memory``, ``cpu``,
        ``identity``, ``network``, ``mounts``, ``devices``), each in words."""
        return {}

    def usage(self) -> dict[ReplicaKey, ReplicaUsage]:
        """What each live replica uses (optional; the default knows nothing). Must not
        block for long: the telemetry sampler calls it every few seconds."""
        return {}

    def wake_on_end(self, port: int, secret: str) -> None:
        """Ask to be told at once when a replica ends: a ``wake`` datagram to ``port`` of
        127.0.0.1 with ``secret`` (see :mod:`allotment.control.wake`), so that the freed
        devices are given out before the loop's next tick. Optional: the default says
        nothing and the tick finds the end."""
        del port, secret  # nobody is told: the tick finds the end
