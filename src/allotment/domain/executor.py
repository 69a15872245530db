"""Where jobs run: the ``executor`` section of ``cluster.yaml``.

``kind: local`` (the default) runs replicas as processes on the server's machine, on the
nodes the file declares. ``kind: slurm`` hands Allotment's placements to a Slurm cluster:
the nodes come from Slurm's inventory and each pool is recognised by a GRES type, a node
feature or a partition (``slurm.pools``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from allotment.domain.durations import parse_duration

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


class ExecutorSpec(_Model):
    """The ``executor`` section."""

    kind: Literal["local", "slurm"] = "local"
    slurm: SlurmSettings | None = None

    @model_validator(mode="after")
    def _settings_match_kind(self) -> ExecutorSpec:
        if self.kind == "slurm" and self.slurm is None:
            raise ValueError("kind: slurm needs a slurm section (partition and pools)")
        if self.kind == "local" and self.slurm is not None:
            raise ValueError("a slurm section needs kind: slurm")
        return self
