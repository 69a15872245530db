"""The store's tables as SQLAlchemy 2 typed declarative models.

Portable across SQLite and PostgreSQL: structured values are ``sqlalchemy.JSON`` and every
time is a float of seconds since the epoch (the domain's clock), never a ``DateTime``.
States and failure classes are stored as their string values; the repositories convert
them to the domain enums.

Changing a model means adding an Alembic revision under ``migrations/versions``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Deterministic constraint names, so migrations can drop what they created."""

NAME = 128
"""Length of names: jobs, tenants, queues, users, pools, priority classes."""

STATE = 16
"""Length of lifecycle states and failure classes."""

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
EventId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class ClusterConfig(Base):
    """One applied version of ``cluster.yaml``: the text as written and its SHA-256."""

    __tablename__ = "cluster_configs"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    text: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    applied_at: Mapped[float] = mapped_column(Float)
    applied_by: Mapped[str | None] = mapped_column(String(NAME))


class Job(Base):
    """A job as submitted, with its current state and latest waiting reason (a condition)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME))
    tenant: Mapped[str] = mapped_column(String(NAME))
    queue: Mapped[str] = mapped_column(String(NAME))
    user: Mapped[str] = mapped_column(String(NAME))
    type: Mapped[str] = mapped_column(String(STATE))
    priority_class: Mapped[str] = mapped_column(String(NAME))
    spec: Mapped[dict[str, Any]]
    """The JobSpec as submitted (``JobSpec.model_dump(mode="json")``)."""
    state: Mapped[str] = mapped_column(String(STATE))
    failure_class: Mapped[str | None] = mapped_column(String(STATE))
    """Set while the job is in an ending that carries one; cleared on the next move."""
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    """Number of the latest attempt; 0 before the first start."""
    submit_time: Mapped[float] = mapped_column(Float)
    not_before: Mapped[float | None] = mapped_column(Float)
    reason_code: Mapped[str | None] = mapped_column(String(64))
    reason_message: Mapped[str | None] = mapped_column(Text)
    reason_detail: Mapped[dict[str, Any] | None]
    reason_since: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_jobs_state_submit", "state", "submit_time", "id"),
        Index("ix_jobs_queue_state", "queue", "state", "submit_time"),
        Index("ix_jobs_tenant", "tenant"),
    )


class Attempt(Base):
    """One run of a job: where it was placed, how it ended."""

    __tablename__ = "attempts"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(String(STATE))
    start_time: Mapped[float | None] = mapped_column(Float)
    end_time: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    signal: Mapped[int | None] = mapped_column(Integer)
    failure_class: Mapped[str | None] = mapped_column(String(STATE))
    pool: Mapped[str | None] = mapped_column(String(NAME))
    allocation: Mapped[list[Any]] = mapped_column(JSON, default=list)
    """Placements: ``[{"group", "index", "node", "resources", "devices"}]``."""
    borrowed: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """The part of the allocation charged as borrowed quota, by resource."""

    __table_args__ = (Index("ix_attempts_state_end", "state", "end_time"),)


class Event(Base):
    """Something that happened, in order: a state transition, a reason change, a notice."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str | None] = mapped_column(String(STATE))
    to_state: Mapped[str | None] = mapped_column(String(STATE))
    message: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    __table_args__ = (Index("ix_events_job_id", "job_id", "id"),)


class ApiToken(Base):
    """An API token, kept only as the SHA-256 of its text: who it speaks for (user,
    tenant, role), who issued it, and when it expires or was revoked.

    ``tenant`` is null for platform tokens (role ``admin``: a platform admin)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(NAME))
    tenant: Mapped[str | None] = mapped_column(String(NAME))
    role: Mapped[str] = mapped_column(String(STATE))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_by: Mapped[str] = mapped_column(String(NAME))

    __table_args__ = (Index("ix_api_tokens_tenant", "tenant", "created_at"),)


class AuditRecord(Base):
    """One audited API call: who did what to which object, from where, and the result.

    Append-only and hash-chained (see :mod:`allotment.store.audit`): ``hash`` is the
    SHA-256 of the record's canonical JSON including ``prev_hash``, the previous record's
    ``hash``. Ids are consecutive from 1, assigned under the chain lock.
    """

    __tablename__ = "audit_records"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=False)
    at: Mapped[float] = mapped_column(Float)
    user: Mapped[str] = mapped_column(String(NAME))
    tenant: Mapped[str | None] = mapped_column(String(NAME))
    action: Mapped[str] = mapped_column(String(64))
    object: Mapped[str] = mapped_column(String(512))
    source: Mapped[str] = mapped_column(String(128))
    """The client's address."""
    result: Mapped[str] = mapped_column(String(64))
    """``ok``, ``denied``, or the error code."""
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_audit_records_at", "at"),
        Index("ix_audit_records_tenant_at", "tenant", "at"),
        Index("ix_audit_records_user_at", "user", "at"),
    )


class JobUsage(Base):
    """What one attempt of a job used during one sampling interval: the samples taken
    in ``[interval_start, interval_start + interval_s)`` aggregated into averages and
    maxima. GPU utilisation is a percentage (0 to 100): ``gpu_util_avg`` averaged over
    the attempt's ``gpus`` allocated devices and the samples, ``gpu_util_max`` the
    busiest device in any sample; memory is in bytes; ``cpu_avg`` is in cores. A column
    is null when no source measured it."""

    __tablename__ = "job_usage"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    interval_start: Mapped[float] = mapped_column(Float)
    interval_s: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_util_avg: Mapped[float | None] = mapped_column(Float)
    gpu_util_max: Mapped[float | None] = mapped_column(Float)
    gpu_memory_max: Mapped[int | None] = mapped_column(BigInteger)
    cpu_avg: Mapped[float | None] = mapped_column(Float)
    memory_max: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "interval_start"),
        Index("ix_job_usage_interval_start", "interval_start"),
    )


class DeviceUsage(Base):
    """One accelerator's utilisation (percent) and memory (bytes) over one sampling
    interval, whoever held it."""

    __tablename__ = "device_usage"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253))
    device: Mapped[int] = mapped_column(Integer)
    interval_start: Mapped[float] = mapped_column(Float)
    interval_s: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    util_avg: Mapped[float | None] = mapped_column(Float)
    util_max: Mapped[float | None] = mapped_column(Float)
    memory_max: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("node", "device", "interval_start"),
        Index("ix_device_usage_interval_start", "interval_start"),
    )


class Alert(Base):
    """An alert (``kind``: ``max_wait``, ``idle_warning``, …) and the delivery of its
    webhook call. ``dedupe_key`` makes an alert fire once (e.g. ``max_wait:<job>:<n>``).
    ``delivery`` is ``pending`` (a try is due at ``next_try_at``), ``delivered``,
    ``failed`` (tries exhausted) or ``none`` (no webhook configured)."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    tenant: Mapped[str | None] = mapped_column(String(NAME))
    queue: Mapped[str | None] = mapped_column(String(NAME))
    dedupe_key: Mapped[str] = mapped_column(String(256), unique=True)
    at: Mapped[float] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    webhook: Mapped[str | None] = mapped_column(String(2048))
    delivery: Mapped[str] = mapped_column(String(16), default="pending")
    tries: Mapped[int] = mapped_column(Integer, default=0)
    next_try_at: Mapped[float | None] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_alerts_delivery", "delivery", "next_try_at"),
        Index("ix_alerts_tenant_at", "tenant", "at"),
    )


class LeaderTerm(Base):
    """The current leadership term (one row, ``id`` 1): each new leader raises ``term``,
    and every decision transaction of a leader proves it still holds its term
    (:mod:`allotment.store.fencing`)."""

    __tablename__ = "leader_term"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    term: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String(256), default="")
    since: Mapped[float] = mapped_column(Float)


class IdempotencyKey(Base):
    """A submission made with an ``Idempotency-Key``: the same user repeating the key
    (with the same request) gets the jobs it made, never new ones."""

    __tablename__ = "idempotency_keys"

    user: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    job_ids: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, index=True)


class Service(Base):
    """An inference service: its spec (a ``type: service`` job file, the one replica it
    describes), and what the service controller keeps of it. Each replica runs as an
    ordinary job; ``replicas`` lists the controller's replica jobs with the port each
    listens on and whether it passed its health check (the proxy sends traffic only to
    those). ``generation`` rises with each changed spec (a rolling update)."""

    __tablename__ = "services"
    __table_args__ = (UniqueConstraint("tenant", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME))
    tenant: Mapped[str] = mapped_column(String(NAME))
    queue: Mapped[str] = mapped_column(String(NAME))
    user: Mapped[str] = mapped_column(String(NAME))
    priority_class: Mapped[str] = mapped_column(String(NAME))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    desired: Mapped[int] = mapped_column(Integer)
    replicas: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    """Replica failures in a row since a replica was last ready."""
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    next_start_at: Mapped[float | None] = mapped_column(Float)
    reason_code: Mapped[str | None] = mapped_column(String(64))
    reason_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
