"""Settings of the periodic upkeep (idle and TTL reaping, telemetry, orphans, scratch
expiry) as written in ``cluster.yaml``.

Three places take them:

- a queue's ``reaping`` (inherited by every queue below it that sets none; the nearest
  one wins whole, as ``retry`` does; ``reclaim`` is its former name, still read)::

      reaping:
        idle: {threshold: 5%, window: 30m, warn_before: 10m, exempt: [training]}
        types:
          notebook: {idle_window: 1h, ttl: 12h}
          service: {idle_window: 4h}

- a tenant's ``scratch_expiry`` and ``scratch_grace``;
- the top-level ``telemetry`` section and ``orphans`` policy.

This module is a leaf of ``domain``: it imports neither :mod:`.cluster` nor :mod:`.job`
(which import it), so job types are spelled out in :data:`JOB_TYPES`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from allotment.domain.durations import parse_duration

JOB_TYPES = ("training", "service", "notebook", "batch", "eval", "data")
"""Every job type (the values of ``allotment.domain.job.JobType``)."""

JobTypeName = Literal["training", "service", "notebook", "batch", "eval", "data"]


def _percent(value: object) -> object:
    """``5%`` or ``5`` (a percentage of GPU utilisation)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return value.strip()[:-1].strip()
    return value


Duration = Annotated[float, BeforeValidator(lambda v: parse_duration(v))]
Percent = Annotated[float, BeforeValidator(_percent), Field(ge=0, le=100)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IdlePolicy(_Model):
    """A running job whose allocated GPUs' utilisation stays below ``threshold`` for
    ``window`` is reaped (it ends ``reclaimed``); ``warn_before`` earlier it gets a
    warning. ``exempt`` job types are never reaped for idleness."""

    threshold: Percent = 5.0
    window: Duration = 1800.0
    warn_before: Duration = 600.0
    exempt: list[JobTypeName] = Field(default_factory=list)


class TypePolicy(_Model):
    """Per job type: its own idle window (overriding ``idle.window``) and a time to
    live (reaped after running this long, idle or not)."""

    idle_window: Duration | None = Field(default=None, gt=0)
    ttl: Duration | None = Field(default=None, gt=0)


class ReapingPolicy(_Model):
    """A queue's reaping policy. Idle reaping applies to a job type when ``idle`` is
    set or the type has an ``idle_window``; ``ttl`` only where set."""

    idle: IdlePolicy | None = None
    types: dict[JobTypeName, TypePolicy] = Field(default_factory=dict)

    def idle_rule(self, job_type: str) -> tuple[float, float, float] | None:
        """``(threshold, window, warn_before)`` for ``job_type``, or ``None`` when its
        idleness is never reaped."""
        idle = self.idle or IdlePolicy()
        if job_type in idle.exempt:
            return None
        own = self._type(job_type)
        window = own.idle_window if own is not None else None
        if window is None:
            if self.idle is None:
                return None
            window = idle.window
        return idle.threshold, window, min(idle.warn_before, window)

    def ttl(self, job_type: str) -> float | None:
        """Seconds a job of ``job_type`` may run before it is reaped, or ``None``."""
        own = self._type(job_type)
        return None if own is None else own.ttl

    def with_own(
        self, job_type: JobTypeName, *, ttl: float | None, idle_timeout: float | None
    ) -> ReapingPolicy:
        """This policy for a job that sets its own limits (a notebook's ``ttl`` and
        ``idle_timeout``): the shorter of its own and the queue's apply, and its own
        idle limit applies even where the queue exempts its type."""
        if ttl is None and idle_timeout is None:
            return self
        own = self._type(job_type) or TypePolicy()
        rule = self.idle_rule(job_type)
        window = rule[1] if rule is not None else None
        merged = TypePolicy(
            ttl=_shorter(own.ttl, ttl),
            idle_window=_shorter(window, idle_timeout) if idle_timeout else own.idle_window,
        )
        idle = self.idle
        if idle is not None and idle_timeout and job_type in idle.exempt:
            idle = idle.model_copy(update={"exempt": [t for t in idle.exempt if t != job_type]})
        return ReapingPolicy(idle=idle, types={**self.types, job_type: merged})

    def _type(self, job_type: str) -> TypePolicy | None:
        return next((p for t, p in self.types.items() if t == job_type), None)


def _shorter(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


TelemetrySourceName = Literal["nvml", "fake", "none"]


class TelemetrySettings(_Model):
    """The ``telemetry`` section: where GPU readings come from and how they are kept.

    ``source`` defaults to ``nvml`` when a driver answers, else ``none``; ``fake`` reads
    ``file`` (JSON or YAML mapping ``node/device`` to readings) at every sample.
    ``node`` names the node NVML's devices belong to (default: the cluster's only node,
    else this host's name). Samples are taken every ``interval``, aggregated per
    ``aggregate`` and kept for ``retention``."""

    source: TelemetrySourceName | None = None
    file: str | None = None
    node: str | None = None
    interval: Duration = Field(default=10.0, gt=0)
    aggregate: Duration = Field(default=60.0, gt=0)
    retention: Duration = Field(default=30 * 86400.0, gt=0)

    @model_validator(mode="after")
    def _file_for_fake(self) -> TelemetrySettings:
        if self.source == "fake" and not self.file:
            raise ValueError("source fake needs file: the readings file to read")
        if self.file and self.source != "fake":
            raise ValueError("file goes with source: fake")
        if self.interval > self.aggregate:
            raise ValueError("interval must not exceed aggregate: every interval needs a sample")
        return self


OrphanPolicy = Literal["report", "kill"]
"""``report``: event, audit record and log; ``kill``: also stop what is provably an
orphan (see :mod:`allotment.control.orphans`)."""

DEFAULT_SCRATCH_GRACE_S = 86400.0
