"""Invariants of the accounting figures for arbitrary attempts, samples and windows."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.accounting.figures import (
    GROUPINGS,
    AttemptInput,
    UsageSample,
    Window,
    from_micro,
    group,
    records_for,
    total,
)

NAMES = ("allocated", "used", "idle", "unmeasured", "cpu", "memory", "cost", "interrupted")
T0 = 1_800_000_000.0
times = st.floats(min_value=T0 - 5e5, max_value=T0 + 5e5, allow_nan=False)
PRICES = {"a": 2.5, "b": 0.37, "c": 0.0, "d": 1 / 3}


@st.composite
def attempts(draw: st.DrawFn, number: int) -> AttemptInput:
    start = draw(times)
    end = draw(st.one_of(st.none(), st.floats(min_value=start, max_value=start + 2e5)))
    samples = draw(
        st.lists(
            st.builds(
                UsageSample,
                start=st.floats(min_value=start - 1e3, max_value=start + 2e5),
                length=st.floats(min_value=0, max_value=3e4),
                util=st.one_of(st.none(), st.floats(min_value=0, max_value=100)),
            ),
            max_size=6,
        )
    )
    return AttemptInput(
        job=f"j-{draw(st.integers(0, 5))}",
        attempt=number,
        tenant=draw(st.sampled_from(["vision", "nlp", "speech"])),
        queue=draw(st.sampled_from(["q1", "q2", "q3"])),
        user=draw(st.sampled_from(["alice", "bob"])),
        type=draw(st.sampled_from(["training", "notebook", "service"])),
        priority_class="training",
        state=draw(st.sampled_from(["running", "succeeded", "failed", "preempted", "reclaimed"])),
        failure_class=None,
        pool=draw(st.sampled_from(sorted(PRICES))),
        start=start,
        end=end,
        gpu_milli=draw(st.integers(0, 64_000)),
        cpu_milli=draw(st.integers(0, 256_000)),
        memory_milli=draw(st.integers(0, 2**40 * 1000)),
        samples=tuple(samples),
    )


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[AttemptInput], Window]:
    count = draw(st.integers(0, 12))
    items = [draw(attempts(i + 1)) for i in range(count)]
    since = draw(times)
    until = draw(st.floats(min_value=since + 1e-3, max_value=since + 3e5))
    return items, Window(since=since, until=until)


def exact(value: float) -> Decimal:
    """A figure as a JSON reader that parses decimals would see it."""
    parsed: Decimal = json.loads(json.dumps(value), parse_float=Decimal)
    return parsed


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_group_totals_are_exactly_the_sums_of_the_records(
    world: tuple[list[AttemptInput], Window],
) -> None:
    items, window = world
    records = records_for(items, window, lambda pool: PRICES[pool])
    whole = total(records)
    for record in records:
        f = record.figures
        assert f.allocated == f.used + f.idle + f.unmeasured
        assert min(f.used, f.idle, f.unmeasured, f.cpu, f.memory, f.cost) >= 0
        stopped = record.input.state in ("preempted", "reclaimed")
        assert f.interrupted == (f.allocated if stopped else 0)
        assert window.since <= record.held_from < record.held_until <= window.until
    for by in GROUPINGS:
        groups = group(records, by)
        assert sum(g.attempts for g in groups) == len(records) == whole.attempts
        for name in NAMES:
            of_records = sum(exact(from_micro(getattr(r.figures, name))) for r in records)
            of_groups = sum(exact(from_micro(getattr(g.figures, name))) for g in groups)
            assert of_records == of_groups == exact(from_micro(getattr(whole.figures, name)))
        for g in groups:
            members = [r for r in records if GROUPINGS[by](r.input) == g.key]
            for name in NAMES:
                assert sum(exact(from_micro(getattr(r.figures, name))) for r in members) == exact(
                    from_micro(getattr(g.figures, name))
                )
