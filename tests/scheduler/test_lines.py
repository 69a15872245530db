"""A session's sorted line (``SortedLine``): jobs kept in (class, submit time, arrival)
order as they arrive and leave, whatever is removed at once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.scheduler.lines import SortedLine
from tests.scheduler.builders import NOW, job

# (class value, submit offset) per job; ids are their arrival numbers.
ARRIVALS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), max_size=40)


def filled(arrivals: list[tuple[int, int]]) -> SortedLine:
    line = SortedLine()
    for arrival, (value, offset) in enumerate(arrivals):
        line.add(job(f"j{arrival}", "q", submit=NOW - offset), value, arrival)
    return line


def expected_order(arrivals: list[tuple[int, int]], gone: set[str]) -> list[str]:
    keyed = sorted(
        (-value, NOW - offset, arrival) for arrival, (value, offset) in enumerate(arrivals)
    )
    return [f"j{a}" for _, _, a in keyed if f"j{a}" not in gone]


@settings(max_examples=300, deadline=None)
@given(arrivals=ARRIVALS, data=st.data())
def test_remove_many_keeps_the_rest_in_order(
    arrivals: list[tuple[int, int]], data: st.DataObject
) -> None:
    line = filled(arrivals)
    before = list(line.ids)
    # Any subset (runs at the head, scattered, all, none), given in any order, with
    # ids the line does not hold and repeats mixed in.
    gone = data.draw(st.lists(st.sampled_from(before), unique=True) if before else st.just([]))
    asked = data.draw(st.permutations(gone + gone[:2] + ["absent"]))

    removed = line.remove_many(asked)

    assert [j.id for j in removed] == [i for i in before if i in set(gone)]
    assert line.ids == expected_order(arrivals, set(gone))
    assert [j.id for j in line.jobs] == line.ids
    assert line.keys == sorted(line.keys) and len(line.keys) == len(line.ids)
    assert line.values == [
        v for i, v in zip(before, filled(arrivals).values, strict=True) if i not in gone
    ]
    for job_id in before:
        assert (job_id in line) == (job_id not in gone)
        if job_id not in gone:
            found = line.get(job_id)
            assert found is not None and found.id == job_id


def test_removing_the_head_run_of_a_long_line() -> None:
    line = filled([(0, 0)] * 300)
    removed = line.remove_many([f"j{i}" for i in range(20)] + ["j150"])
    assert [j.id for j in removed] == [f"j{i}" for i in range(20)] + ["j150"]
    assert line.ids[:2] == ["j20", "j21"] and "j150" not in line.ids and len(line) == 279
    assert line.remove_many([]) == [] and len(line) == 279
