"""Resource quantities: parsing as people write them, integer arithmetic.

Every quantity is held as an integer number of *milli-units* (as Kubernetes'
``MilliValue``): ``cpu: 500m`` is 500, ``gpu: 8`` is 8000, ``memory: 1Ki`` is 1,024,000.
This keeps fractional GPUs and CPUs exact and makes every resource add the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from decimal import Context, Decimal, Inexact, InvalidOperation
from typing import Any

from allotment.domain.errors import InvalidQuantity

MILLI = 1000
"""Milli-units in one unit."""

MAX_MILLI = 10**30
"""Largest quantity accepted, in milli-units (far above any real fleet: 10^27 units)."""
_EXACT = Context(prec=64, traps=[InvalidOperation, Inexact])

GPU = "gpu"
CPU = "cpu"
MEMORY = "memory"
GPU_MEMORY = "gpu_memory"
STORAGE = "storage"
SHM = "shm"
STANDARD_RESOURCES = (GPU, CPU, MEMORY, GPU_MEMORY, STORAGE, SHM)
BYTE_RESOURCES = frozenset({MEMORY, GPU_MEMORY, STORAGE, SHM})

_NAME = re.compile(r"^[a-z0-9]([a-z0-9._/-]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*$")
_SUFFIX: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(value: object, *, name: str | None = None) -> int:
    """Parse ``8``, ``0.5``, ``500m``, ``64Gi``, ``1.5Ti`` into integer milli-units.

    Raises :class:`InvalidQuantity` for negative, non-numeric, unknown-suffix,
    sub-milli (``0.0001``) or absurdly large (over :data:`MAX_MILLI`) values, with what
    was wrong.
    """
    if isinstance(value, bool):
        raise InvalidQuantity(value, "expected a number or a quantity string", name=name)
    if isinstance(value, int):
        number = Decimal(value)
        suffix_factor = Decimal(1)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidQuantity(value, "not a finite number", name=name)
        number = Decimal(repr(value))
        suffix_factor = Decimal(1)
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        if not match:
            raise InvalidQuantity(
                value,
                "expected a number with an optional suffix like 500m, 64Gi, 2k",
                name=name,
            )
        digits, suffix = match.groups()
        if suffix == "m":
            suffix_factor = Decimal(1) / Decimal(MILLI)
        elif suffix in _SUFFIX:
            suffix_factor = Decimal(_SUFFIX[suffix])
        else:
            raise InvalidQuantity(
                value,
                f"unknown suffix {suffix!r}; use m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi or Ei",
                name=name,
            )
        try:
            number = Decimal(digits)
        except InvalidOperation as exc:  # pragma: no cover - regex already checked
            raise InvalidQuantity(value, "not a number", name=name) from exc
    else:
        raise InvalidQuantity(value, "expected a number or a quantity string", name=name)
    if number.adjusted() > 30:
        raise InvalidQuantity(value, "too large", name=name)
    try:
        milli = _EXACT.multiply(_EXACT.multiply(number, suffix_factor), Decimal(MILLI))
    except (Inexact, InvalidOperation) as exc:
        raise InvalidQuantity(value, "too many significant digits", name=name) from exc
    if milli > MAX_MILLI:
        raise InvalidQuantity(value, "too large", name=name)
    if milli < 0:
        raise InvalidQuantity(value, "must not be negative", name=name)
    if milli != milli.to_integral_value():
        raise InvalidQuantity(value, "finer than one thousandth of a unit", name=name)
    return int(milli)


def check_resource_name(name: object) -> str:
    """Return ``name`` if it is a valid resource name (``gpu``, ``rdma/ib``), else raise."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidQuantity(
            name,
            "resource names are lower-case letters, digits and . _ / - (e.g. gpu, rdma/ib)",
        )
    return name


def format_quantity(resource: str, milli: int) -> str:
    """Render milli-units the way people write them (``8``, ``500m``, ``64Gi``)."""
    if milli % MILLI:
        return f"{milli}m"
    units = milli // MILLI
    if resource in BYTE_RESOURCES and units:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            factor = _SUFFIX[suffix]
            if units % factor == 0:
                return f"{units // factor}{suffix}"
    return str(units)


def to_units(milli: int) -> float:
    """Milli-units as a plain number of units (for reports and messages)."""
    return milli / MILLI


class Resources(Mapping[str, int]):
    """An immutable bag of resource quantities in milli-units; absent names are zero.

    Explicit zeros are kept (a limit of ``gpu: 0`` names the resource), but equality and
    hashing ignore them.

    Arithmetic is integer and exact. ``a.fits_in(b)`` is true when every quantity of
    ``a`` is at most the one in ``b``.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, int] | None = None) -> None:
        cleaned: dict[str, int] = {}
        for key, amount in (values or {}).items():
            if amount < 0:
                raise InvalidQuantity(amount, "must not be negative", name=key)
            cleaned[key] = int(amount)
        self._values = cleaned

    @classmethod
    def parse(cls, spec: Mapping[str, Any] | None) -> Resources:
        """Parse a mapping of names to quantities as written in YAML."""
        if spec is None:
            return cls()
        if isinstance(spec, Resources):
            return spec
        if not isinstance(spec, Mapping):
            raise InvalidQuantity(spec, "expected a mapping of resource names to quantities")
        return cls({check_resource_name(k): parse_quantity(v, name=k) for k, v in spec.items()})

    @classmethod
    def of(cls, **units: float | int | str) -> Resources:
        """Build from keyword quantities in units: ``Resources.of(gpu=8, memory="64Gi")``."""
        return cls.parse(units)

    def __getitem__(self, key: str) -> int:
        return self._values.get(key, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def _nonzero(self) -> dict[str, int]:
        return {k: v for k, v in self._values.items() if v}

    def __hash__(self) -> int:
        return hash(frozenset(self._nonzero().items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Resources):
            return self._nonzero() == other._nonzero()
        if isinstance(other, Mapping):
            return self._nonzero() == {k: v for k, v in other.items() if v}
        return NotImplemented

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={format_quantity(k, v)}" for k, v in sorted(self._values.items()))
        return f"Resources({inner})"

    def as_dict(self) -> dict[str, int]:
        """A fresh plain dict of milli-units (for hot loops and serialisation)."""
        return dict(self._values)

    def __add__(self, other: Mapping[str, int]) -> Resources:
        out = dict(self._values)
        for key, amount in other.items():
            out[key] = out.get(key, 0) + amount
        return Resources(out)

    def __sub__(self, other: Mapping[str, int]) -> Resources:
        """Subtract; raises :class:`InvalidQuantity` if any result would be negative."""
        out = dict(self._values)
        for key, amount in other.items():
            out[key] = out.get(key, 0) - amount
        return Resources(out)

    def minus_clamped(self, other: Mapping[str, int]) -> Resources:
        """Subtract, flooring each quantity at zero."""
        return Resources({k: max(0, v - other.get(k, 0)) for k, v in self._values.items()})

    def __mul__(self, factor: int) -> Resources:
        if factor < 0:
            raise InvalidQuantity(factor, "cannot scale resources by a negative factor")
        return Resources({k: v * factor for k, v in self._values.items()})

    __rmul__ = __mul__

    def fits_in(self, other: Mapping[str, int]) -> bool:
        """True when every quantity here is at most the same quantity in ``other``."""
        return all(amount <= other.get(key, 0) for key, amount in self._values.items())

    def shortfall(self, available: Mapping[str, int]) -> dict[str, int]:
        """What is missing from ``available`` to hold this, per resource (only the > 0)."""
        return {
            k: v - available.get(k, 0) for k, v in self._values.items() if v > available.get(k, 0)
        }

    def units(self, key: str) -> float:
        """One quantity as a plain number of units."""
        return to_units(self._values.get(key, 0))

    def display(self) -> dict[str, str]:
        """Human quantities (``{"gpu": "8", "memory": "64Gi"}``)."""
        return {k: format_quantity(k, v) for k, v in sorted(self._values.items())}


ZERO = Resources()
