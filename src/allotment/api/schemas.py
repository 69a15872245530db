"""Wire schemas: the JSON the API reads and writes, separate from the domain models.

Inputs forbid unknown keys, so a typo in a request is an error, not a silently ignored field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

MAX_SPEC_CHARS = 512 * 1024
"""Longest job spec text accepted (the body as a whole is capped separately)."""


class Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Output(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SubmitRequest(Input):
    """``POST /jobs``: the job file's text, YAML or JSON, exactly as a user wrote it."""

    spec: str = Field(min_length=1, max_length=MAX_SPEC_CHARS)


class SubmitManyRequest(Input):
    """``POST /jobs:batch``: several job files' texts, stored all together or not at all."""

    specs: list[Annotated[str, Field(min_length=1, max_length=MAX_SPEC_CHARS)]] = Field(
        min_length=1
    )


class ReasonOut(Output):
    code: str
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)
    since: float | None = None


class JobOut(Output):
    id: str
    name: str
    queue: str
    tenant: str
    user: str
    type: str
    priority_class: str
    state: str
    failure_class: str | None
    attempt: int
    submit_time: float
    not_before: float | None
    reason: ReasonOut | None
    spec: dict[str, Any]
    created_at: float
    updated_at: float


class JobList(Output):
    jobs: list[JobOut]


class JobPage(Output):
    """One page of jobs; pass ``next_after`` as ``after`` for the next (``None``: last page)."""

    jobs: list[JobOut]
    next_after: str | None


class EventOut(Output):
    id: int
    job: str | None
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    message: str
    detail: dict[str, Any]


class EventList(Output):
    job: str
    events: list[EventOut]


class QueueOut(Output):
    name: str
    tenant: str | None
    leaf: bool
    nominal_gpu: dict[str, float | int]
    children: list[QueueOut]


class QueueTree(Output):
    queues: list[QueueOut]


class Health(Output):
    status: str


class ErrorOut(Output):
    """Every error body: a stable ``code``, a ``message`` that says what to change, detail."""

    code: str
    message: str
    fields: dict[str, Any] = Field(default_factory=dict)
