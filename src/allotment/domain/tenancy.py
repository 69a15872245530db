"""Tenants: the isolation boundary. Members with roles, data scopes, the images they
may run, and the uid their containers run under."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from allotment.domain.errors import Issue
from allotment.domain.executor import RuntimeSpec
from allotment.domain.fields import Duration, ImagePattern, Model, Name
from allotment.domain.upkeep import DEFAULT_SCRATCH_GRACE_S
from allotment.domain.webhook import Webhook


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class Member(Model):
    user: Annotated[str, Field(min_length=1, max_length=128)]
    role: Role = Role.MEMBER


DEFAULT_TENANT = "default"
"""The tenant of jobs in queues that name none."""


class DataScope(Model):
    """A path (or ``scheme://bucket/prefix``) a tenant's jobs may mount; read-only
    unless ``writable``. Written as a plain string for a read-only scope."""

    path: Annotated[str, Field(min_length=1, max_length=4096)]
    writable: bool = False

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: object) -> object:
        return {"path": data} if isinstance(data, str) else data


class Tenant(Model):
    """The isolation boundary: members with roles and declared data scopes."""

    name: Name
    data_scopes: list[DataScope] = Field(default_factory=list)
    members: list[Member] = Field(default_factory=list)
    scratch_expiry: Duration | None = Field(default=None, gt=0)
    """Ended jobs' work directories older than this are reported, then deleted."""
    scratch_grace: Duration = DEFAULT_SCRATCH_GRACE_S
    """Time between the report of an expired work directory and its deletion."""
    webhook: Webhook | None = None
    """Where this tenant's alerts (e.g. ``max_wait``) are delivered; none: not sent."""
    images: list[ImagePattern] = Field(default_factory=list)
    """Image references or ``*`` patterns this tenant's jobs may run (besides the
    runtime's ``default_image``); a pattern without a tag or digest admits them all."""
    public_services: bool = False
    """Whether this tenant's services may be marked ``public`` (their address answers
    without a token)."""
    uid: int | None = Field(default=None, ge=1000, le=2**31 - 2)
    """The uid and gid this tenant's containers run under (default: one derived from
    its name inside ``executor.runtime.uids``)."""


def derived_uid(tenant: str, runtime: RuntimeSpec) -> int:
    """A tenant's uid when it sets none: a stable hash of its name into the range."""
    return runtime.uids.first + zlib.crc32(tenant.encode()) % runtime.uids.count


def check_uids(tenants: Sequence[Tenant], runtime: RuntimeSpec, issues: list[Issue]) -> None:
    """Two tenants must never share a uid: a shared uid would let one read the other's
    files. Reported only when containers are on (plain processes use no uids)."""
    if not runtime.containers:
        return
    owners: dict[int, str] = {}
    if all(tenant.name != DEFAULT_TENANT for tenant in tenants):
        # Jobs of queues without a tenant run as tenant "default", under its uid.
        owners[derived_uid(DEFAULT_TENANT, runtime)] = f"{DEFAULT_TENANT} (queues without one)"
    for i, tenant in enumerate(tenants):
        uid = tenant.uid if tenant.uid is not None else derived_uid(tenant.name, runtime)
        if uid in owners:
            issues.append(
                Issue(
                    path=f"tenants.{i}.uid",
                    message=(
                        f"tenant {tenant.name!r} would run under uid {uid}, as tenant "
                        f"{owners[uid]!r} does; give one of them its own uid"
                    ),
                )
            )
        owners.setdefault(uid, tenant.name)
