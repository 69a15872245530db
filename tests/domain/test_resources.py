"""Quantities as people write them, and exact integer arithmetic on resource bags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allotment.domain.errors import InvalidQuantity
from allotment.domain.resources import (
    BYTE_RESOURCES,
    MAX_MILLI,
    ZERO,
    Resources,
    check_resource_name,
    format_quantity,
    parse_quantity,
)

GI = 2**30


@pytest.mark.parametrize(
    ("value", "milli"),
    [
        pytest.param("8", 8_000, id="whole"),
        pytest.param("0.5", 500, id="fraction"),
        pytest.param("500m", 500, id="milli-suffix"),
        pytest.param("1m", 1, id="one-milli"),
        pytest.param("64Gi", 64 * GI * 1000, id="gibi"),
        pytest.param("1.5Ti", 3 * 2**39 * 1000, id="fractional-tebi"),
        pytest.param("2k", 2_000_000, id="kilo"),
        pytest.param("3M", 3 * 10**9, id="mega"),
        pytest.param("1Ki", 1_024_000, id="kibi"),
        pytest.param("1e3", 1_000_000, id="exponent"),
        pytest.param("1e-3", 1, id="negative-exponent"),
        pytest.param("2E", 2 * 10**21, id="exa-not-exponent"),
        pytest.param(" 4 ", 4_000, id="surrounding-space"),
        pytest.param("5 Gi", 5 * GI * 1000, id="space-before-suffix"),
        pytest.param("+2", 2_000, id="explicit-plus"),
        pytest.param(".5", 500, id="leading-dot"),
        pytest.param("0", 0, id="zero-string"),
        pytest.param(8, 8_000, id="int"),
        pytest.param(0, 0, id="zero-int"),
        pytest.param(0.25, 250, id="float"),
        pytest.param(1.5, 1_500, id="float-1.5"),
    ],
)
def test_parse_quantity_accepts(value: object, milli: int) -> None:
    assert parse_quantity(value) == milli


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("-1", "negative", id="negative-string"),
        pytest.param(-1, "negative", id="negative-int"),
        pytest.param(-0.5, "negative", id="negative-float"),
        pytest.param("abc", "expected a number", id="letters"),
        pytest.param("5x", "unknown suffix", id="unknown-suffix"),
        pytest.param("0.0001", "thousandth", id="sub-milli"),
        pytest.param("0.5m", "thousandth", id="half-milli"),
        pytest.param(True, "expected a number", id="bool-true"),
        pytest.param(False, "expected a number", id="bool-false"),
        pytest.param(None, "expected a number", id="none"),
        pytest.param(float("nan"), "finite", id="nan"),
        pytest.param(float("inf"), "finite", id="inf"),
        pytest.param("nan", "expected a number", id="nan-string"),
        pytest.param("inf", "expected a number", id="inf-string"),
        pytest.param("", "expected a number", id="empty"),
        pytest.param([8], "expected a number", id="list"),
        pytest.param("1e999999999", "too large", id="huge-exponent"),
        pytest.param("1" + "0" * 40, "too large", id="huge-digits"),
        pytest.param("1." + "0" * 70 + "1", "digits", id="too-many-digits"),
    ],
)
def test_parse_quantity_rejects(value: object, why: str) -> None:
    with pytest.raises(InvalidQuantity, match=why) as info:
        parse_quantity(value, name="gpu")
    assert info.value.code == "invalid_quantity"
    assert info.value.fields["name"] == "gpu"
    assert isinstance(info.value, ValueError)


def test_max_milli_is_accepted_and_one_more_unit_is_not() -> None:
    assert parse_quantity(str(MAX_MILLI // 1000)) == MAX_MILLI
    with pytest.raises(InvalidQuantity, match="too large"):
        parse_quantity(str(MAX_MILLI // 1000 + 1))


@pytest.mark.parametrize("name", ["gpu", "cpu", "rdma/ib", "nvidia.com/gpu", "a-b_c"])
def test_resource_names_accepted(name: str) -> None:
    assert check_resource_name(name) == name


@pytest.mark.parametrize("name", ["GPU", "", "-gpu", "gpu-", "g pu", 3, None])
def test_resource_names_rejected(name: object) -> None:
    with pytest.raises(InvalidQuantity):
        check_resource_name(name)


def test_parse_mapping() -> None:
    res = Resources.parse({"gpu": 8, "cpu": "500m", "memory": "64Gi", "rdma/ib": 1})
    assert res == {"gpu": 8000, "cpu": 500, "memory": 64 * GI * 1000, "rdma/ib": 1000}
    assert Resources.parse(None) == ZERO
    assert Resources.parse(res) is res
    with pytest.raises(InvalidQuantity):
        Resources.parse([1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidQuantity):
        Resources.parse({"GPU": 1})
    with pytest.raises(InvalidQuantity):
        Resources.parse({"gpu": "-1"})


def test_explicit_zeros_are_kept_but_do_not_change_equality() -> None:
    # A limit of `gpu: 0` must name the resource (it means "none", not "unlimited").
    res = Resources.of(gpu=0, cpu=2)
    assert dict(res) == {"cpu": 2000, "gpu": 0}
    assert "gpu" in res
    assert "memory" not in res
    assert res["gpu"] == 0 and res["memory"] == 0
    assert res == {"cpu": 2000}
    assert res == Resources.of(cpu=2)
    assert hash(res) == hash(Resources.of(cpu=2))
    assert Resources() == ZERO


def test_negative_values_are_refused_by_the_constructor() -> None:
    with pytest.raises(InvalidQuantity):
        Resources({"gpu": -1})


@pytest.mark.parametrize(
    ("a", "b", "total", "difference"),
    [
        ({"gpu": 8}, {"gpu": 2}, {"gpu": 10}, {"gpu": 6}),
        (
            {"gpu": 8, "cpu": "500m"},
            {"cpu": "250m"},
            {"gpu": 8, "cpu": "750m"},
            {"gpu": 8, "cpu": "250m"},
        ),
        ({"memory": "1Gi"}, {"memory": "1Gi"}, {"memory": "2Gi"}, {}),
        ({}, {}, {}, {}),
    ],
)
def test_add_and_subtract(
    a: dict[str, object],
    b: dict[str, object],
    total: dict[str, object],
    difference: dict[str, object],
) -> None:
    ra, rb = Resources.parse(a), Resources.parse(b)
    assert ra + rb == Resources.parse(total)
    assert ra - rb == Resources.parse(difference)
    assert ra + rb - rb == ra


def test_subtract_below_zero_raises_and_minus_clamped_floors() -> None:
    small, big = Resources.of(gpu=1, cpu=4), Resources.of(gpu=2)
    with pytest.raises(InvalidQuantity):
        small - big
    assert small.minus_clamped(big) == Resources.of(cpu=4)


def test_scale() -> None:
    res = Resources.of(gpu=2, memory="8Gi")
    assert res * 3 == Resources.of(gpu=6, memory="24Gi")
    assert 3 * res == res * 3
    assert res * 0 == ZERO
    with pytest.raises(InvalidQuantity):
        res * -1


@pytest.mark.parametrize(
    ("need", "have", "fits", "short"),
    [
        pytest.param({"gpu": 8}, {"gpu": 8, "cpu": 96}, True, {}, id="exact"),
        pytest.param({"gpu": 9}, {"gpu": 8}, False, {"gpu": 1000}, id="one-short"),
        pytest.param(
            {"gpu": 1, "shm": "1Gi"}, {"gpu": 8}, False, {"shm": GI * 1000}, id="missing-resource"
        ),
        pytest.param({}, {}, True, {}, id="nothing-fits-nothing"),
        pytest.param({"cpu": "1500m"}, {"cpu": 1}, False, {"cpu": 500}, id="fractional"),
        pytest.param(
            {"gpu": 2, "cpu": 4},
            {"gpu": 1, "cpu": 2},
            False,
            {"gpu": 1000, "cpu": 2000},
            id="two-short",
        ),
    ],
)
def test_fits_in_and_shortfall(
    need: dict[str, object], have: dict[str, object], fits: bool, short: dict[str, int]
) -> None:
    rn, rh = Resources.parse(need), Resources.parse(have)
    assert rn.fits_in(rh) is fits
    assert rn.shortfall(rh) == short
    assert (rn.shortfall(rh) == {}) is fits


def test_display_repr_units_and_hash() -> None:
    res = Resources.of(gpu=8, cpu="500m", memory="64Gi", storage="1.5Ti")
    assert res.display() == {"cpu": "500m", "gpu": "8", "memory": "64Gi", "storage": "1536Gi"}
    assert repr(res) == "Resources(cpu=500m, gpu=8, memory=64Gi, storage=1536Gi)"
    assert res.units("gpu") == 8.0
    assert res.units("cpu") == 0.5
    assert res.units("shm") == 0.0
    assert hash(res) == hash(Resources(res.as_dict()))
    assert res.as_dict() is not res.as_dict()


@pytest.mark.parametrize(
    ("resource", "milli", "text"),
    [
        ("gpu", 8000, "8"),
        ("gpu", 500, "500m"),
        ("cpu", 0, "0"),
        ("memory", 0, "0"),
        ("memory", 64 * GI * 1000, "64Gi"),
        ("memory", 1000 * 1000, "1000"),
        ("memory", 1024 * 1000, "1Ki"),
        ("shm", 2**40 * 1000, "1Ti"),
        ("gpu", 1024 * 1000, "1024"),  # binary suffixes only for byte resources
    ],
)
def test_format_quantity(resource: str, milli: int, text: str) -> None:
    assert format_quantity(resource, milli) == text
    assert parse_quantity(text) == milli


resource_names = st.sampled_from(["gpu", "cpu", "rdma/ib", *sorted(BYTE_RESOURCES)])
millis = st.one_of(
    st.integers(min_value=0, max_value=MAX_MILLI),
    st.integers(min_value=0, max_value=2**20).map(lambda n: n * 2**30 * 1000),
    st.integers(min_value=0, max_value=10**6),
)


@given(resource=resource_names, milli=millis)
def test_format_then_parse_round_trips(resource: str, milli: int) -> None:
    assert parse_quantity(format_quantity(resource, milli)) == milli


bags = st.dictionaries(
    st.sampled_from(["gpu", "cpu", "memory", "rdma/ib"]), st.integers(min_value=0, max_value=10**15)
).map(Resources)


@given(a=bags, b=bags)
def test_arithmetic_laws(a: Resources, b: Resources) -> None:
    assert a + b == b + a
    assert (a + b) - b == a
    assert a.fits_in(a + b)
    assert a.minus_clamped(b).fits_in(a)
    assert (a + b).minus_clamped(b) == a
    short = a.shortfall(b)
    assert a.fits_in(b + short)
    assert (not short) == a.fits_in(b)


@given(a=bags)
def test_display_parses_back(a: Resources) -> None:
    assert Resources.parse(a.display()) == a
