"""The one error tree of Allotment.

Every error a user can cause carries a stable ``code``, a ``message`` that says what to
change, and ``fields`` (structured detail). The API maps ``code`` to an HTTP status in one
handler; the CLI prints ``message``.

::

    AllotmentError
    ├── InvalidInput (ValueError)            code=invalid_input
    │   ├── InvalidQuantity                  code=invalid_quantity
    │   ├── ConfigError                      code=invalid_config   (a list of issues)
    │   │   └── MountNotAllowed              code=mount_not_allowed (outside the data scopes)
    │   └── IllegalTransition                code=illegal_transition
    ├── NotFound (LookupError)               code=not_found
    ├── Conflict                             code=conflict
    │   └── AlreadyEnded                     code=already_ended
    ├── Unauthenticated                      code=unauthenticated (no valid credentials)
    └── Forbidden (PermissionError)          code=forbidden (the role needed is named)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class AllotmentError(Exception):
    """Base of every error Allotment raises on purpose."""

    code: str = "error"

    def __init__(self, message: str, *, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = dict(fields or {})

    def to_dict(self) -> dict[str, Any]:
        """The JSON body the API returns: ``{code, message, fields}``."""
        return {"code": self.code, "message": self.message, "fields": self.fields}


class InvalidInput(AllotmentError, ValueError):
    """Input a user wrote is not acceptable."""

    code = "invalid_input"


class InvalidQuantity(InvalidInput):
    """A resource quantity or duration that cannot be parsed or is out of range."""

    code = "invalid_quantity"

    def __init__(self, value: object, why: str, *, name: str | None = None) -> None:
        where = f" for {name!r}" if name else ""
        super().__init__(
            f"invalid quantity {value!r}{where}: {why}",
            fields={"value": str(value), "name": name, "why": why},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Issue:
    """One problem in a file a user wrote: where (dotted path and line) and what."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.path or "<root>"
        if self.line is not None:
            where = f"line {self.line}: {where}"
        return f"{where}: {self.message}"


class ConfigError(InvalidInput):
    """A cluster or job file has one or more problems; each names its path and line."""

    code = "invalid_config"

    def __init__(self, issues: list[Issue], *, source: str | None = None) -> None:
        self.issues = list(issues)
        self.source = source
        head = f"{source}: " if source else ""
        count = len(self.issues)
        lines = "\n".join(f"  - {i}" for i in self.issues)
        noun = "problem" if count == 1 else "problems"
        super().__init__(
            f"{head}{count} {noun}:\n{lines}",
            fields={
                "source": source,
                "issues": [
                    {"path": i.path, "line": i.line, "message": i.message} for i in self.issues
                ],
            },
        )


class MountNotAllowed(ConfigError):
    """A job mounts a path outside its tenant's data scopes."""

    code = "mount_not_allowed"

    def __init__(
        self, issues: list[Issue], *, tenant: str, scopes: list[str], source: str | None = None
    ) -> None:
        super().__init__(issues, source=source)
        self.fields["tenant"] = tenant
        self.fields["scopes"] = list(scopes)


class IllegalTransition(InvalidInput):
    """A lifecycle transition that the state machine does not allow."""

    code = "illegal_transition"

    def __init__(self, current: str, target: str, allowed: list[str]) -> None:
        allowed_text = ", ".join(allowed) if allowed else "none (terminal state)"
        super().__init__(
            f"a job cannot go from {current} to {target}; from {current} it may go to: "
            f"{allowed_text}",
            fields={"from": current, "to": target, "allowed": allowed},
        )


class NotFound(AllotmentError, LookupError):
    """A named object does not exist (or is not visible to the caller)."""

    code = "not_found"

    def __init__(self, kind: str, name: str, *, known: list[str] | None = None) -> None:
        hint = ""
        if known is not None:
            shown = ", ".join(sorted(known)[:20]) or "none"
            hint = f"; known {kind}s: {shown}"
        super().__init__(f"no {kind} named {name!r}{hint}", fields={"kind": kind, "name": name})


class Conflict(AllotmentError):
    """The request is valid but the object's current state does not allow it."""

    code = "conflict"


class AlreadyEnded(Conflict):
    """An action on a job that has already ended (e.g. cancelling a succeeded job)."""

    code = "already_ended"

    def __init__(self, job_id: str, state: str, action: str) -> None:
        super().__init__(
            f"job {job_id!r} has already ended ({state}); there is nothing to {action}",
            fields={"job": job_id, "state": state, "action": action},
        )


class Unauthenticated(AllotmentError):
    """No credentials, or credentials that are not (or no longer) valid; ``why`` says
    which: ``missing``, ``invalid``, ``expired`` or ``revoked``."""

    code = "unauthenticated"

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(
            f"{detail}: send 'Authorization: Bearer <token>' (the CLI reads it from "
            "ALLOT_TOKEN or the config file that 'allot up' writes)",
            fields={"why": why},
        )


class Forbidden(AllotmentError, PermissionError):
    """The caller is known but its role does not allow the action; ``needed`` names the
    role that would."""

    code = "forbidden"

    def __init__(self, action: str, needed: str) -> None:
        super().__init__(f"{action} needs {needed}", fields={"action": action, "needed": needed})
