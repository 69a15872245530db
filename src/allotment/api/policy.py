"""Authorisation: the one table of who may do what, and the one function that reads it.

Roles, from the most to the least:

- **platform admin** (role ``admin``, no tenant): everything.
- **tenant admin** (role ``admin`` of a tenant): what a member may, on any of the
  tenant's jobs; manages the tenant's tokens; reads the tenant's audit records.
- **member**: submits to the tenant's queues (narrowed by a queue's ``submitters``),
  cancels its own jobs, reads the tenant's jobs, logs and queues.
- **viewer**: reads the tenant's jobs, logs and queues.

An object of another tenant is answered as if it did not exist (404, ``not_found``), so
that existence does not leak; an object of the platform (a queue without a tenant, a
platform token) needs a platform admin (403); a known object the role does not allow is a 403
(``forbidden``, naming the role needed). Listings are narrowed by :func:`visible_tenant`
in their queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from allotment.api.auth import Principal
from allotment.domain.errors import Forbidden, NotFound
from allotment.domain.tenancy import Role


class Action(StrEnum):
    JOB_SUBMIT = "submitting to a queue"
    JOB_READ = "reading a job, its events, reason and logs"
    JOB_CANCEL = "cancelling a job"
    QUEUE_READ = "reading queues"
    FLEET_READ = "reading pools and nodes"
    CLUSTER_READ = "reading the cluster configuration"
    CLUSTER_APPLY = "applying a cluster configuration"
    TOKEN_READ = "listing tokens"
    TOKEN_MANAGE = "issuing or revoking tokens"
    AUDIT_READ = "reading the audit trail"
    AUDIT_VERIFY = "verifying the whole audit chain"
    REPORT_READ = "reading usage and cost reports"
    ALERT_READ = "reading alerts"
    METRICS_READ = "reading the metrics of every tenant"
    SERVICE_CALL = "calling a service through its endpoint"
    NOTEBOOK_OPEN = "opening a notebook"
    HISTORY_READ = "replaying or exporting recorded history"


PLATFORM = None
"""In :data:`RULES`: only a platform admin."""

RULES: dict[Action, Role | None] = {
    Action.JOB_READ: Role.VIEWER,
    Action.QUEUE_READ: Role.VIEWER,
    Action.FLEET_READ: Role.VIEWER,
    Action.REPORT_READ: Role.VIEWER,  # its tenant's jobs only
    Action.JOB_SUBMIT: Role.MEMBER,
    Action.JOB_CANCEL: Role.MEMBER,  # its own jobs; a tenant admin any of the tenant's
    Action.TOKEN_READ: Role.ADMIN,
    Action.TOKEN_MANAGE: Role.ADMIN,
    Action.AUDIT_READ: Role.ADMIN,  # a tenant admin: its tenant's records only
    Action.AUDIT_VERIFY: PLATFORM,  # the chain spans every tenant
    Action.CLUSTER_READ: PLATFORM,
    Action.CLUSTER_APPLY: PLATFORM,
    Action.ALERT_READ: Role.VIEWER,  # its tenant's alerts
    Action.METRICS_READ: PLATFORM,  # the metrics span every tenant
    Action.SERVICE_CALL: Role.VIEWER,  # its tenant's services
    Action.NOTEBOOK_OPEN: Role.MEMBER,  # its own notebooks; a tenant admin any of the tenant's
    Action.HISTORY_READ: Role.ADMIN,  # a tenant admin: its tenant's queues only
}
"""The least tenant role each action needs, within the principal's own tenant."""

RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2}

OWN_ONLY = frozenset({Action.JOB_CANCEL, Action.NOTEBOOK_OPEN})
"""Actions a member may do on its own objects only (a tenant admin on any of the
tenant's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Owned:
    """What a rule looks at in an object: its kind and name (for the 404), its tenant
    (``None``: the platform's), its user, and a queue's ``submitters``."""

    kind: str
    name: str
    tenant: str | None
    user: str | None = None
    submitters: tuple[str, ...] | None = None


class Verdict(Enum):
    ALLOW = "allow"
    HIDDEN = "hidden"
    FORBIDDEN = "forbidden"


def decide(principal: Principal, action: Action, obj: Owned | None = None) -> tuple[Verdict, str]:
    """The verdict of ``action`` on ``obj`` (``None``: no particular object) and, when
    forbidden, the role that would be allowed."""
    if principal.platform_admin:
        return Verdict.ALLOW, ""
    if obj is not None and obj.tenant is not None and obj.tenant != principal.tenant:
        return Verdict.HIDDEN, ""
    needs = RULES[action]
    if needs is PLATFORM or (obj is not None and obj.tenant is None):
        return Verdict.FORBIDDEN, "a platform admin"
    if principal.tenant is None or RANK[principal.role] < RANK[needs]:
        return Verdict.FORBIDDEN, f"role {needs.value} in tenant {principal.tenant}"
    mine = obj is None or obj.user == principal.user
    if action in OWN_ONLY and not mine and principal.role is not Role.ADMIN:
        kind = obj.kind if obj is not None else "job"
        return Verdict.FORBIDDEN, f"role admin in tenant {principal.tenant} (another user's {kind})"
    submitters = obj.submitters if obj is not None else None
    if action is Action.JOB_SUBMIT and submitters is not None and principal.user not in submitters:
        assert obj is not None
        return Verdict.FORBIDDEN, f"being one of queue {obj.name}'s submitters"
    return Verdict.ALLOW, ""


def may(principal: Principal, action: Action, obj: Owned | None = None) -> bool:
    """Whether ``principal`` may do ``action`` on ``obj``."""
    return decide(principal, action, obj)[0] is Verdict.ALLOW


def require(principal: Principal, action: Action, obj: Owned | None = None) -> None:
    """Return when allowed; raise ``NotFound`` for an object of another tenant,
    ``Forbidden`` (naming the role needed) otherwise."""
    verdict, needed = decide(principal, action, obj)
    if verdict is Verdict.HIDDEN:
        assert obj is not None
        raise NotFound(obj.kind, obj.name)
    if verdict is Verdict.FORBIDDEN:
        raise Forbidden(action.value, needed)


def visible_tenant(principal: Principal) -> str | None:
    """The tenant a listing is narrowed to; ``None``: every tenant (a platform admin)."""
    return None if principal.platform_admin else principal.tenant or ""
