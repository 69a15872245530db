"""The field types of every model that reads user input (``cluster.yaml``, job files):
names, quantities, durations, text, and the :class:`Model` base that forbids unknown
keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from allotment.domain.durations import parse_duration
from allotment.domain.resources import Resources

MAX_JOB_REPLICAS = 10_000
"""The most replicas one job may have, all groups together (a queue may allow fewer)."""

_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=_NAME_PATTERN)]
"""Object names: lower-case letters, digits, ``.``, ``_`` and ``-``, at most 64 characters."""

ResourcesField = Annotated[
    Resources,
    BeforeValidator(Resources.parse),
    PlainSerializer(lambda r: r.display(), return_type=dict[str, str]),
]
Duration = Annotated[float, BeforeValidator(lambda v: parse_duration(v))]


def _not_a_boolean(value: object) -> object:
    """``count: true`` is not 1: a count is written as a number."""
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number, not the boolean {str(value).lower()}")
    return value


Count = Annotated[int, BeforeValidator(_not_a_boolean)]
"""A whole number, never a boolean."""


def _scalar_text(value: object) -> object:
    """Numbers and booleans written where text is meant (``rack: 1``, ``cuda: 12.4``,
    ``NCCL_DEBUG: 1``) become their text; anything else is left to validation."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


Text = Annotated[str, BeforeValidator(_scalar_text)]
"""A label, topology or environment value: text, with plain numbers accepted as text."""
ImagePattern = Annotated[str, Field(pattern=r"^[A-Za-z0-9._:/@*?-]{1,512}$")]
"""An image reference, or a pattern of one with ``*`` and ``?`` (``registry/team/*``)."""
PoolQuota = dict[str, ResourcesField]
"""Per-pool resources: ``{a100: {gpu: 16, cpu: 200}}``."""


class Model(BaseModel):
    """Base of every model that reads user input: unknown keys are errors."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, arbitrary_types_allowed=True, populate_by_name=True
    )
