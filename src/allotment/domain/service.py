"""Inference services as users write them (``type: service`` with a ``service:`` block),
and the pure rules that keep one running: how many replicas it wants for the load it
sees, how long to wait before starting a replica again, and when restarts are a crash
loop.

A service is a set of replicas that the service controller keeps running; each replica
is an ordinary job (one process, one allocation) that the scheduler places like any
other, so quota, priority and borrowing hold for every replica, and ``allot why``
explains a replica that waits. Nothing here reads a clock or does I/O: the controller
passes ``now`` and what it measured.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, model_validator

from allotment.domain.fields import Count, Duration, Model

PORT_ENV = "PORT"
"""The variable that tells a replica (or a notebook) the port to listen on."""

MAX_SERVICE_REPLICAS = 100
"""The most replicas one service may scale to."""


class ReplicaRange(Model):
    """How many replicas run: never fewer than ``min`` (0: scale to zero when idle),
    never more than ``max``."""

    min: Count = Field(default=1, ge=0, le=MAX_SERVICE_REPLICAS)
    max: Count = Field(default=1, ge=1, le=MAX_SERVICE_REPLICAS)

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        if self.min > self.max:
            raise ValueError(f"replicas.min ({self.min}) must not exceed replicas.max ({self.max})")
        return self


class HealthCheck(Model):
    """An HTTP ``GET path`` on each replica every ``interval``: an answer below 400
    within ``timeout`` passes. A replica takes traffic after its first pass (readiness)
    and is restarted after ``failure_threshold`` failures in a row once it was ready,
    or when it is not ready ``start_timeout`` after it started."""

    path: Annotated[str, Field(pattern=r"^/[\x21-\x7e]{0,1023}$")] = "/"
    interval: Duration = Field(default=5.0, gt=0)
    timeout: Duration = Field(default=2.0, gt=0)
    failure_threshold: Count = Field(default=3, ge=1, le=100)
    start_timeout: Duration = Field(default=300.0, gt=0)


class Autoscaling(Model):
    """Scale on the requests in flight that the proxy measures: ``target`` per replica
    on average over ``window``; up at once (one request for resources per replica),
    down only after ``scale_down_delay`` without a need for more."""

    target: float = Field(default=10.0, gt=0)
    window: Duration = Field(default=10.0, gt=0)
    scale_down_delay: Duration = Field(default=60.0, ge=0)


class RestartPolicy(Model):
    """Replicas are always restarted when they end; the ``n``-th consecutive failure
    waits ``backoff * 2^(n-1)`` (at most ``max_backoff``). After ``crash_loop_after``
    failures in a row without a replica becoming ready, the service's reason is
    ``crash_loop`` (restarts go on, at the longest back-off)."""

    backoff: Duration = Field(default=1.0, ge=0)
    max_backoff: Duration = Field(default=300.0, ge=0)
    crash_loop_after: Count = Field(default=5, ge=1, le=1000)

    def delay(self, failures: int) -> float:
        """Seconds before the next start after ``failures`` failures in a row."""
        if failures <= 0:
            return 0.0
        return float(min(self.max_backoff, self.backoff * 2.0 ** min(failures - 1, 64)))


class ServiceSettings(Model):
    """The ``service:`` block of a ``type: service`` job file."""

    replicas: ReplicaRange = Field(default_factory=ReplicaRange)
    port: Count | None = Field(default=None, ge=1, le=65535)
    """Ignored by the process runtime (each replica listens on ``$PORT``, which the
    controller picks); kept for the container port of image-based services."""
    health: HealthCheck = Field(default_factory=HealthCheck)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    public: bool = False
    """Its address answers without a token (only where its tenant allows
    ``public_services``)."""

    @model_validator(mode="before")
    @classmethod
    def _flat_range(cls, data: object) -> object:
        """``min_replicas``/``max_replicas`` are accepted for ``replicas: {min, max}``."""
        if not isinstance(data, dict) or not {"min_replicas", "max_replicas"} & data.keys():
            return data
        if "replicas" in data:
            raise ValueError("write replicas: {min, max} or min_replicas/max_replicas, not both")
        data = dict(data)
        flat = {k: data.pop(f"{k}_replicas") for k in ("min", "max") if f"{k}_replicas" in data}
        data["replicas"] = flat
        return data


def load_wants(settings: ServiceSettings, in_flight: float) -> int:
    """The replicas ``in_flight`` requests (on average) ask for, between min and max."""
    bounds = settings.replicas
    wanted = math.ceil(in_flight / settings.autoscaling.target - 1e-9) if in_flight > 0 else 0
    return max(bounds.min, min(bounds.max, wanted))


def desired_replicas(
    settings: ServiceSettings,
    *,
    current: int,
    in_flight: float,
    now: float,
    last_needed_more: float,
) -> int:
    """How many replicas the service wants: ``in_flight`` is the number of requests in
    flight the load is judged by; ``current`` the replicas it wants now;
    ``last_needed_more`` when the load last asked for ``current`` or more. Up at once,
    down only ``scale_down_delay`` after that (at once when the spec's max fell)."""
    wanted = load_wants(settings, in_flight)
    if wanted >= current:
        return wanted
    if current > settings.replicas.max:
        return settings.replicas.max
    if now - last_needed_more < settings.autoscaling.scale_down_delay:
        return current
    return wanted
