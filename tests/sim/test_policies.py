from __future__ import annotations

import pytest

from allotment.scheduler.policy import compose
from allotment.scheduler.victims import SparingCovered
from allotment.sim.policies import PRESETS, UnknownPolicy, parse_policy, policy_flags


def flags(name: str) -> dict[str, bool]:
    out = policy_flags(parse_policy(name))
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize(
    ("name", "on"),
    [
        ("fifo-isolated", {"strict_fifo"}),
        ("borrowing", {"borrowing", "reclaim"}),
        ("fair-share", {"borrowing", "reclaim", "fair_share"}),
        ("backfill", {"strict_fifo", "backfill"}),
        ("default", {"borrowing", "preemption", "reclaim", "fair_share", "backfill"}),
    ],
)
def test_presets(name: str, on: set[str]) -> None:
    assert set(flags(name)) == on
    assert parse_policy(name).name == name


def test_composition_ors_the_flags() -> None:
    policy = parse_policy("borrowing+backfill")
    assert set(flags("borrowing+backfill")) == {"borrowing", "reclaim", "backfill", "strict_fifo"}
    assert policy.name == "borrowing+backfill"
    assert not policy.oracle


def test_oracle_modifier() -> None:
    policy = parse_policy("default+oracle")
    assert policy.oracle
    assert policy.borrowing and policy.backfill and policy.preemption
    assert not parse_policy("default").oracle
    assert parse_policy(" Default + Oracle ").name == "default+oracle"


def test_protect_modifier_composes_a_victim_rule_that_spares_covered_jobs() -> None:
    policy = parse_policy("fair-share+protect")
    assert policy.protect_covered and not policy.oracle
    assert policy.borrowing and policy.reclaim and policy.fair_share
    assert not parse_policy("fair-share").protect_covered
    rule = compose(policy).victims
    assert isinstance(rule, SparingCovered)
    assert rule.inner is compose(parse_policy("fair-share")).victims
    assert not isinstance(compose(parse_policy("default")).victims, SparingCovered)


@pytest.mark.parametrize(
    "name", ["fifo", "default+magic", "", "default+", "oracle", "protect", "oracle+protect"]
)
def test_unknown_names_list_the_known_ones(name: str) -> None:
    with pytest.raises(UnknownPolicy) as caught:
        parse_policy(name)
    for preset in PRESETS:
        assert preset in caught.value.message
    assert "+oracle" in caught.value.message
    assert "+protect" in caught.value.message


@pytest.mark.parametrize(
    ("name", "strategies"),
    [
        (
            "fifo-isolated",
            ("SubmitOrder", "NoPreemption", "IsolatedQuota", "NoReservations", "StrictFifo"),
        ),
        (
            "borrowing",
            ("SubmitOrder", "ReclaimOnly", "BorrowingQuota", "NoReservations", "BestEffortFifo"),
        ),
        (
            "fair-share",
            ("FairShareOrder", "ReclaimOnly", "BorrowingQuota", "NoReservations", "BestEffortFifo"),
        ),
        ("backfill", ("SubmitOrder", "NoPreemption", "IsolatedQuota", "Backfill", "BackfillFifo")),
        (
            "default",
            (
                "FairShareOrder",
                "PriorityAndReclaim",
                "BorrowingQuota",
                "Backfill",
                "BestEffortFifo",
            ),
        ),
        (
            "borrowing+backfill",
            ("SubmitOrder", "ReclaimOnly", "BorrowingQuota", "Backfill", "BackfillFifo"),
        ),
    ],
)
def test_presets_compose_one_strategy_per_concern(name: str, strategies: tuple[str, ...]) -> None:
    rules = compose(parse_policy(name))
    parts = (rules.order, rules.victims, rules.quota, rules.reservations, rules.line)
    assert tuple(type(part).__name__ for part in parts) == strategies
    assert compose(parse_policy(f"{name}+oracle")) == rules
