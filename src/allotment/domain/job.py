"""Job specs as users write them (``job.yaml``; ``examples/jobs/`` shows every field)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from allotment.domain.cluster import RetryPolicy
from allotment.domain.executor import ImageReference, parse_bytes
from allotment.domain.fields import (
    MAX_JOB_REPLICAS,
    Count,
    Duration,
    Model,
    Name,
    ResourcesField,
    Text,
)
from allotment.domain.resources import CPU, GPU, MILLI, Resources
from allotment.domain.service import ServiceSettings
from allotment.domain.text import PlainText

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
"""An environment variable's name, as shells accept it (letters, digits, ``_``)."""


class JobType(StrEnum):
    TRAINING = "training"
    SERVICE = "service"
    NOTEBOOK = "notebook"
    BATCH = "batch"
    EVAL = "eval"
    DATA = "data"


DEFAULT_CPU = 1 * MILLI
"""What a replica that asks for no GPU and names no ``cpu`` asks for: one CPU, as Slurm
gives each task. Every replica then holds something, so quota and node capacity bound
how many run at once."""


class ReplicaGroup(Model):
    """``count`` identical replicas, each needing ``resources``. A replica asks for a
    share of one GPU (``gpu: 0.5``) or for whole GPUs (``gpu: 2``), never for 1.5; one
    that asks for no GPU asks for some CPU (:data:`DEFAULT_CPU` when it names none)."""

    name: Name = "worker"
    count: Count = Field(default=1, ge=1, le=MAX_JOB_REPLICAS)
    resources: ResourcesField = Field(default_factory=Resources, validate_default=True)

    @field_validator("resources")
    @classmethod
    def _possible(cls, resources: Resources) -> Resources:
        gpu = resources.get(GPU, 0)
        if gpu > MILLI and gpu % MILLI:
            raise ValueError(
                f"gpu {gpu / MILLI:g} is not possible: ask for a share "
                "of one GPU (at most 1, e.g. 0.5) or for whole GPUs (e.g. 1 or 2)"
            )
        if gpu:
            return resources
        if CPU not in resources:
            return Resources({**resources, CPU: DEFAULT_CPU})
        if not resources[CPU]:
            raise ValueError(
                "a replica that asks for no GPU must ask for some cpu (e.g. cpu: 1 or "
                "cpu: 500m); leave cpu out to ask for 1"
            )
        return resources


RESERVED_TARGET = "/allotment"
"""Where Allotment mounts the working directory inside a container (``/allotment/work``)."""
_RESERVED_TARGETS = ("/proc", "/sys", "/dev", RESERVED_TARGET)
UNMOUNTABLE = ',"\n\r'
"""Characters a container runtime's mount option cannot carry in a path (Podman reads
``--mount`` as a CSV line: a comma splits it, a double quote breaks it)."""


class Mount(Model):
    """A host path (or data set) mounted at ``target`` inside the job's container;
    read-only unless ``read_only: false`` (and the tenant's scope allows writing)."""

    source: Annotated[str, Field(min_length=1, max_length=4096)]
    target: Annotated[str, Field(min_length=1, max_length=4096)]
    read_only: bool = True

    @model_validator(mode="after")
    def _target(self) -> Mount:
        target = self.target
        if not target.startswith("/"):
            raise ValueError(f"target {target!r} must be an absolute path")
        parts = [p for p in target.split("/") if p]
        if ".." in parts or "." in parts:
            raise ValueError(f"target {target!r} must not contain . or .. components")
        if any(c in target for c in UNMOUNTABLE):
            raise ValueError(
                f"target {target!r} must not contain commas, double quotes or newlines"
            )
        normal = "/" + "/".join(parts)
        if normal == "/":
            raise ValueError("target must not be / (the image's root)")
        for reserved in _RESERVED_TARGETS:
            if normal == reserved or normal.startswith(reserved + "/"):
                raise ValueError(f"target {target!r} is reserved ({reserved})")
        return self


class NotebookSettings(Model):
    """Notebooks and experiment environments: a time to live and an idle limit."""

    ttl: Duration | None = None
    idle_timeout: Duration | None = None


class JobSpec(Model):
    """What a user submits. The scheduler never sees a true duration, only
    ``max_runtime`` (a limit) and ``expected_runtime`` (a hint)."""

    name: Annotated[PlainText, Field(min_length=1, max_length=128)]
    queue: str
    type: JobType = JobType.TRAINING
    priority_class: str | None = None
    replicas: list[ReplicaGroup] = Field(min_length=1, max_length=64)
    pools: list[str] = Field(default_factory=list)
    image: ImageReference | None = None
    """The container image (``host[:port]/path[:tag][@sha256:...]``), checked against the
    tenant's allow-list; never anything Podman could read as an option."""
    command: list[str] = Field(default_factory=list)
    env: dict[EnvName, Text] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    network: bool = False
    """Ask for the network (the queue must allow it); otherwise a container has none."""
    shm: Annotated[int, Field(ge=1 << 20, le=1 << 50)] | None = None
    """The size of ``/dev/shm`` in each replica's container, in bytes (``16Gi``)."""
    max_runtime: Duration | None = None
    expected_runtime: Duration | None = None
    retry: RetryPolicy | None = None
    preemptible: bool = False
    """May be preempted even where its priority class is not (a service's replicas above
    its minimum are made so): it gives up a protection, never gains one."""
    service: ServiceSettings | None = None
    notebook: NotebookSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _sizes(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("shm") is not None:
            data = {**data, "shm": parse_bytes(data["shm"], name="shm")}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        names = [g.name for g in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError("replica group names must be unique")
        if self.replica_count > MAX_JOB_REPLICAS:
            raise ValueError(
                f"a job has at most {MAX_JOB_REPLICAS:,} replicas in all; this one has "
                f"{self.replica_count:,}"
            )
        if (
            self.max_runtime is not None
            and self.expected_runtime is not None
            and self.expected_runtime > self.max_runtime
        ):
            raise ValueError("expected_runtime must not exceed max_runtime")
        if self.service is not None and self.type is not JobType.SERVICE:
            raise ValueError("service settings need type: service")
        if self.type is JobType.SERVICE and self.replica_count != 1:
            raise ValueError(
                "a service's job file describes one replica (replicas: [{count: 1, ...}]); "
                "set how many run with service: {replicas: {min, max}}"
            )
        if self.notebook is not None and self.type is not JobType.NOTEBOOK:
            raise ValueError("notebook settings need type: notebook")
        return self

    @property
    def replica_count(self) -> int:
        return sum(g.count for g in self.replicas)

    def total_resources(self) -> Resources:
        """Everything the job asks for, all replicas together."""
        total = Resources()
        for group in self.replicas:
            total = total + group.resources * group.count
        return total
