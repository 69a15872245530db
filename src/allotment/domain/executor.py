"""Where jobs run: the ``executor`` section of ``cluster.yaml``.

``kind: local`` (the default) runs replicas on the server's machine, on the nodes the
file declares. ``kind: slurm`` hands Allotment's placements to a Slurm cluster: the nodes
come from Slurm's inventory and each pool is recognised by a GRES type, a node feature or
a partition (``slurm.pools``).

``runtime`` says how each replica runs, on either executor: ``kind: process`` (the
default) as a plain process of the server's user, which refuses jobs that name an
``image`` or ``mounts``; ``kind: podman`` as a container of its image (Podman
with the ``runc`` OCI runtime), under its tenant's uid, with only its declared mounts,
its devices, CPU and memory limits, and no network unless allowed.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from allotment.domain.durations import parse_duration
from allotment.domain.resources import MILLI, parse_quantity

_SLURM_WORD = r"^[A-Za-z0-9._-]{1,64}$"
SlurmWord = Annotated[str, Field(pattern=_SLURM_WORD)]
"""A partition, GRES type, feature, account or QOS name as Slurm writes them."""

SIGNALS = ("TERM", "INT", "USR1", "USR2", "HUP")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlurmPool(_Model):
    """How to recognise a pool's nodes in Slurm: every criterion given must match."""

    gres_type: SlurmWord | None = None
    """The node has GPUs of this GRES type (``gpu:a100:4`` has type ``a100``); only
    they count as the node's GPUs."""
    feature: SlurmWord | None = None
    """The node lists this feature (``AvailableFeatures``)."""
    partition: SlurmWord | None = None
    """The node belongs to this partition."""

    @model_validator(mode="after")
    def _some_criterion(self) -> SlurmPool:
        if self.gres_type is None and self.feature is None and self.partition is None:
            raise ValueError("give at least one of gres_type, feature or partition")
        return self


class SlurmSettings(_Model):
    """How Allotment talks to Slurm (see the README's "Running on Slurm")."""

    partition: SlurmWord
    """The partition jobs are submitted to; it must span every mapped node."""
    pools: dict[str, SlurmPool] = Field(min_length=1)
    """Pool name (declared under ``pools``) → how its nodes are recognised."""
    bin_dir: str | None = None
    """Where ``sbatch``, ``squeue``, ``scontrol`` and ``scancel`` are (default: PATH)."""
    command_prefix: list[str] = Field(default_factory=list)
    """Run every Slurm command through this, e.g. ``[ssh, slurm-login]``."""
    export_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list
    )
    """Server environment variables passed to jobs, besides PATH, HOME, LANG, TZ, USER."""
    account: SlurmWord | None = None
    qos: SlurmWord | None = None
    stop_signal: Literal["TERM", "INT", "USR1", "USR2", "HUP"] = "TERM"
    """Sent to a job's replicas to stop it; SIGKILL follows after the grace period."""
    pending_timeout: Annotated[float, Field(gt=0)] = 300.0
    """A job Slurm keeps pending this long after Allotment placed it is given up on
    (``node_failure``) and cancelled in Slurm."""

    @model_validator(mode="before")
    @classmethod
    def _durations(cls, data: object) -> object:
        if isinstance(data, dict) and "pending_timeout" in data:
            data = {**data, "pending_timeout": parse_duration(data["pending_timeout"])}
        return data


IMAGE_REFERENCE = (
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
"""An image reference as OCI tools write it: ``host[:port]/path[:tag][@sha256:…]``."""
_IMAGE = re.compile(IMAGE_REFERENCE)


def _image_reference(value: str) -> str:
    if len(value) > 512 or _IMAGE.fullmatch(value) is None:
        raise ValueError(
            f"{value[:100]!r} is not an image reference: write host[:port]/path[:tag]"
            "[@sha256:digest], the path in lower case"
        )
    return value


ImageReference = Annotated[str, AfterValidator(_image_reference)]


class UidRange(_Model):
    """The uids (and gids, the same numbers) tenants run under: a tenant without its own
    ``uid`` gets a stable one in ``[first, first + count)``, derived from its name."""

    first: Annotated[int, Field(ge=1000, le=2**31 - 2)] = 100_000
    count: Annotated[int, Field(ge=1, le=2**24)] = 65_536

    @model_validator(mode="after")
    def _fits(self) -> UidRange:
        if self.first + self.count > 2**31 - 1:
            raise ValueError("first + count must stay below 2147483647")
        return self


class RuntimeSpec(_Model):
    """How replicas run (the ``executor.runtime`` section)."""

    kind: Literal["process", "podman"] = "process"
    podman: Annotated[str, Field(min_length=1, max_length=4096)] = "podman"
    """The Podman program (a name on PATH or an absolute path)."""
    oci_runtime: Annotated[str, Field(min_length=1, max_length=4096)] = "runc"
    """The OCI runtime Podman uses (``runc``; ``crun`` refuses cgroup v1 hybrid hosts)."""
    default_image: ImageReference | None = None
    """The image of jobs that name none; every tenant may use it."""
    pull: Literal["never", "missing"] = "missing"
    """``missing``: pull an image the node lacks before starting; ``never``: an image
    the node lacks fails the attempt (class ``image``)."""
    uids: UidRange = Field(default_factory=UidRange)
    device_dir: Annotated[str, Field(pattern=r"^/.*")] = "/dev"
    """Where the GPUs' device nodes (``nvidia0``, ``nvidiactl``, …) are."""
    gpu_devices: Literal["auto", "device", "cdi"] = "auto"
    """How GPUs are passed in: ``device`` (``--device /dev/nvidiaN``), ``cdi``
    (``nvidia.com/gpu=N``, with the NVIDIA container toolkit), or ``auto`` (CDI when a
    CDI specification for ``nvidia.com/gpu`` is installed)."""
    shm: Annotated[int, Field(ge=1 << 20)] = 64 << 20
    """The default size of ``/dev/shm`` in bytes (a job may set its own ``shm``)."""

    @model_validator(mode="before")
    @classmethod
    def _sizes(cls, data: object) -> object:
        if isinstance(data, dict) and "shm" in data:
            data = {**data, "shm": parse_bytes(data["shm"], name="shm")}
        return data

    @property
    def containers(self) -> bool:
        """Whether replicas run as containers (else as plain processes)."""
        return self.kind != "process"


def parse_bytes(value: object, *, name: str) -> int:
    """A size written as people write it (``64Mi``, ``1Gi``, ``1000000``) in bytes."""
    return parse_quantity(value, name=name) // MILLI


class ExecutorSpec(_Model):
    """The ``executor`` section."""

    kind: Literal["local", "slurm"] = "local"
    slurm: SlurmSettings | None = None
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)

    @model_validator(mode="after")
    def _settings_match_kind(self) -> ExecutorSpec:
        if self.kind == "slurm" and self.slurm is None:
            raise ValueError("kind: slurm needs a slurm section (partition and pools)")
        if self.kind == "local" and self.slurm is not None:
            raise ValueError("a slurm section needs kind: slurm")
        return self
