from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from allotment.domain.cluster import Cluster
from allotment.domain.job import JobType
from allotment.sim.trace import (
    TraceError,
    TraceJob,
    check_trace,
    jittered,
    read_trace,
    read_trace_rows,
)

HEADER = "job_id,submit_time,duration,queue,gpus,replicas,cpu,memory,pool,priority_class,type"
GOOD = f"""{HEADER},max_runtime,user
j1,0,100,team-a,4,1,8,32Gi,a100,training,training,2h,ada
j2,5.5,30,team-b,0.5,,500m,,,,,,
j3,7,60,team-b,2,2,,,,,eval,90, bob
"""


def rows(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def test_reads_every_column_in_units() -> None:
    j1, j2, j3 = read_trace_rows(rows(GOOD), source="t.csv")
    assert (j1.job_id, j1.submit_time, j1.duration, j1.queue) == ("j1", 0.0, 100.0, "team-a")
    assert (j1.gpus, j1.cpu, j1.memory) == (4000, 8000, 32 * 2**30 * 1000)
    assert (j1.pool, j1.priority_class, j1.type, j1.max_runtime) == (
        "a100",
        "training",
        JobType.TRAINING,
        7200.0,
    )
    assert (j2.gpus, j2.cpu, j2.memory, j2.replicas, j2.pool, j2.max_runtime) == (
        500,
        500,
        None,
        1,
        None,
        None,
    )
    assert (j3.replicas, j3.total_gpus, j3.type, j3.max_runtime, j3.line) == (
        2,
        4000,
        JobType.EVAL,
        90.0,
        4,
    )
    assert (j1.user, j2.user, j3.user) == ("ada", None, "bob")


def test_only_required_columns_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,duration,queue,gpus\na,0,1,q,1\n\nb,1,1,q,0\n")
    jobs = read_trace(path)
    assert [j.job_id for j in jobs] == ["a", "b"]
    assert jobs[1].gpus == 0


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("x,abc,10,team-a,1", "submit_time must be a number"),
        ("x,0,-5,team-a,1", "duration must be a finite, non-negative"),
        ("x,0,10,team-a,lots", "invalid quantity 'lots' for 'gpus'"),
        ("x,0,10,team-a,0.0001", "finer than one thousandth"),
        ("x,0,10,,1", "queue is empty"),
        (",0,10,team-a,1", "job_id is empty"),
        ("x,0,10,team-a,1,extra", "6 cells, the header has 5"),
        ("x,0,10", "too few cells"),
    ],
)
def test_bad_row_names_its_line(row: str, expected: str) -> None:
    text = f"job_id,submit_time,duration,queue,gpus\nok,0,1,team-a,1\n{row}\n"
    with pytest.raises(TraceError) as caught:
        read_trace_rows(rows(text), source="t.csv")
    assert caught.value.line == 3
    assert caught.value.message.startswith("t.csv line 3: ")
    assert expected in caught.value.message


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("type", "rocket", "unknown type 'rocket'; known types: training, service"),
        ("replicas", "two", "replicas must be a whole number"),
        ("replicas", "0", "replicas must be between 1"),
        ("max_runtime", "soon", "max_runtime"),
        ("max_runtime", "0", "max_runtime must be positive"),
        ("memory", "64Gb", "unknown suffix 'Gb'"),
    ],
)
def test_bad_optional_values(column: str, value: str, expected: str) -> None:
    text = f"job_id,submit_time,duration,queue,gpus,{column}\nx,0,1,team-a,1,{value}\n"
    with pytest.raises(TraceError) as caught:
        read_trace_rows(rows(text), source="t.csv")
    assert "line 2" in caught.value.message
    assert expected in caught.value.message


def test_header_problems_are_on_line_1() -> None:
    with pytest.raises(TraceError, match=r"line 1: missing column\(s\) duration"):
        read_trace_rows(rows("job_id,submit_time,queue,gpus\n"), source="t.csv")
    with pytest.raises(TraceError, match=r"line 1: unknown column\(s\) 'colour'; known columns"):
        read_trace_rows(rows("job_id,submit_time,duration,queue,gpus,colour\n"), source="t.csv")
    with pytest.raises(TraceError, match="empty file"):
        read_trace_rows([], source="t.csv")


def test_duplicate_job_id_names_both_lines() -> None:
    text = "job_id,submit_time,duration,queue,gpus\na,0,1,q,1\nb,0,1,q,1\na,2,1,q,1\n"
    with pytest.raises(TraceError, match="line 4: job_id 'a' already used on line 2"):
        read_trace_rows(rows(text), source="t.csv")


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read: No such file"):
        read_trace(tmp_path / "absent.csv")


def test_check_against_cluster(tiny_cluster: Cluster) -> None:
    check_trace(read_trace_rows(rows(GOOD), source="t.csv"), tiny_cluster, source="t.csv")
    bad_queue = "job_id,submit_time,duration,queue,gpus\na,0,1,team-a,1\nb,0,1,team-z,1\n"
    with pytest.raises(TraceError) as caught:
        check_trace(read_trace_rows(rows(bad_queue)), tiny_cluster, source="t.csv")
    assert caught.value.message == (
        "t.csv line 3: job b: unknown queue 'team-z'; queues in the cluster: team-a, team-b"
    )
    inner = "job_id,submit_time,duration,queue,gpus\na,0,1,org,1\n"
    with pytest.raises(TraceError, match="'org' has child queues; jobs go to leaves"):
        check_trace(read_trace_rows(rows(inner)), tiny_cluster, source="t.csv")
    pool = "job_id,submit_time,duration,queue,gpus,pool\na,0,1,team-a,1,h100\n"
    with pytest.raises(TraceError, match="pool 'h100' is not open to queue team-a"):
        check_trace(read_trace_rows(rows(pool)), tiny_cluster, source="t.csv")
    klass = "job_id,submit_time,duration,queue,gpus,priority_class\na,0,1,team-a,1,vip\n"
    with pytest.raises(TraceError, match="priority class 'vip' is not allowed"):
        check_trace(read_trace_rows(rows(klass)), tiny_cluster, source="t.csv")


def test_pool_and_pools_agree() -> None:
    common = {"job_id": "j", "submit_time": 0.0, "duration": 1.0, "queue": "q", "gpus": 1}
    assert TraceJob(**common, pool="a").pools == ("a",)
    assert TraceJob(**common, pools=("a",)).pool == "a"
    two = TraceJob(**common, pools=("a", "b"))
    assert (two.pool, two.pools) == (None, ("a", "b"))
    with pytest.raises(ValueError, match="disagree"):
        TraceJob(**common, pool="a", pools=("a", "b"))


def test_every_one_of_several_pools_must_be_open(tiny_cluster: Cluster) -> None:
    job = TraceJob(
        job_id="j", submit_time=0, duration=1, queue="team-a", gpus=1, pools=("a100",), line=7
    )
    check_trace([job], tiny_cluster, source="t.csv")
    both = TraceJob(
        job_id="j", submit_time=0, duration=1, queue="team-a", gpus=1, pools=("a100", "h100")
    )
    with pytest.raises(TraceError, match="job j: pool 'h100' is not open to queue team-a"):
        check_trace([both], tiny_cluster, source="t.csv")


def test_jittered_copies_delay_each_job_by_under_a_second() -> None:
    jobs = [
        TraceJob(job_id=f"j{i}", submit_time=float(i // 3), duration=10.0, queue="q", gpus=1)
        for i in range(30)
    ]
    jobs[4] = TraceJob(
        job_id="j4", submit_time=1.0, duration=10.0, queue="q", gpus=1, withdraw_at=5.0
    )
    first, again, other = jittered(jobs, 1), jittered(jobs, 1), jittered(jobs, 2)
    assert first == again  # a seed draws the same copy every time
    assert first != other
    assert [j.job_id for j in first] == [j.job_id for j in jobs]
    for before, after in zip(jobs, first, strict=True):
        delay = after.submit_time - before.submit_time
        assert 0 <= delay < 1
        assert after == replace(
            before,
            submit_time=after.submit_time,
            withdraw_at=None if before.withdraw_at is None else before.withdraw_at + delay,
        )
    assert first[4].withdraw_at is not None and first[4].withdraw_at - first[4].submit_time == 4.0
    # Jobs submitted in the same second are drawn into a new order.
    order = [j.job_id for j in sorted(first, key=lambda j: j.submit_time)]
    assert order != [j.job_id for j in jobs]
    assert sorted(order) == sorted(j.job_id for j in jobs)
