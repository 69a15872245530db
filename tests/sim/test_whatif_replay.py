"""Recorded history as a replay (``sim/history.py``), the replay's extras for it (retries,
withdrawals, a window's end, configuration changes, the live loop's turn and stop
latency) and the what-if comparison (``sim/whatif.py``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from tests.sim.conftest import TINY_CLUSTER

from allotment.domain.cluster import Cluster
from allotment.domain.errors import InvalidInput
from allotment.domain.history import RecordedJob, RecordedRun
from allotment.domain.loading import load_cluster_text
from allotment.sim.history import replay_jobs, trace_csv
from allotment.sim.policies import parse_policy
from allotment.sim.replay import Replay
from allotment.sim.results import CANCELLED, FAILED, SUCCEEDED, UNFINISHED
from allotment.sim.trace import TraceJob, read_trace_rows
from allotment.sim.whatif import compare, fit_jobs
from allotment.sim.whatif_figures import order_agreement, recorded_outcome, worse

T0 = 1_800_000_000.0


def spec(gpus: int = 4, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": "secret-name",
        "queue": "team-a",
        "replicas": [{"name": "worker", "count": count, "resources": {"gpu": str(gpus)}}],
        "command": ["python", "secret.py"],
        **extra,
    }


def recorded(
    job_id: str,
    submit: float,
    runs: tuple[RecordedRun, ...] = (),
    *,
    queue: str = "team-a",
    state: str = "succeeded",
    withdrawn: float | None = None,
    **extra: Any,
) -> RecordedJob:
    return RecordedJob(
        id=job_id,
        tenant="default",
        queue=queue,
        priority_class="normal",
        type="training",
        submit_time=submit,
        spec=spec(**extra),
        state=state,
        runs=runs,
        withdrawn=withdrawn,
    )


def run(admitted: float, released: float | None, ended_as: str | None = "succeeded", **kw: Any):
    return RecordedRun(admitted=admitted, released=released, ended_as=ended_as, **kw)


def trace(job_id: str, submit: float, **kw: Any) -> TraceJob:
    base: dict[str, Any] = {"duration": 10.0, "queue": "team-a", "gpus": 4000}
    return TraceJob(job_id=job_id, submit_time=submit, **{**base, **kw})


@pytest.fixture
def cluster() -> Cluster:
    return load_cluster_text(TINY_CLUSTER, source="tiny")


def fifo() -> Any:
    return parse_policy("fifo-isolated")


# ------------------------------------------------------------------ history as a trace


def test_runs_keep_failures_and_drop_preemptions() -> None:
    job = recorded(
        "j",
        T0,
        (
            run(T0 + 1, T0 + 4, "failed"),
            run(T0 + 5, T0 + 6, "preempted", stopped=T0 + 7),
            run(T0 + 8, T0 + 18),
        ),
        count=2,
        max_runtime=3600.0,
        expected_runtime=60.0,
    )
    out = replay_jobs([job])
    (converted,) = out.jobs
    assert converted.runs == ((3.0, FAILED), (10.0, SUCCEEDED))
    assert converted.total_gpus == 8000 and converted.replicas == 2
    assert converted.max_runtime == 3600.0 and converted.expected_runtime == 60.0
    assert out.stop_latency == 1.0 and out.estimated == 0


def test_a_job_that_never_ran_gets_its_queues_median_and_is_counted() -> None:
    jobs = [
        recorded("a", T0, (run(T0, T0 + 10),)),
        recorded("b", T0, (run(T0, T0 + 30),)),
        recorded("waiting", T0 + 1, state="pending"),
        recorded("declared", T0 + 1, state="pending", expected_runtime=99.0),
        recorded("open", T0 + 2, (run(T0 + 3, None, None),), state="running"),
        recorded("gone", T0 + 2, state="cancelled", withdrawn=T0 + 5),
    ]
    out = replay_jobs(jobs)
    by_id = {j.job_id: j for j in out.jobs}
    assert by_id["waiting"].runs == ((20.0, SUCCEEDED),)
    assert by_id["declared"].runs == ((99.0, SUCCEEDED),)
    assert by_id["open"].runs == ((math.inf, UNFINISHED),)
    assert by_id["gone"].withdraw_at == T0 + 5
    assert (out.estimated, out.open_runs, out.withdrawn) == (2, 1, 1)


def test_the_live_loops_turn_is_read_from_when_ends_were_seen() -> None:
    jobs = [
        recorded(f"j{i}", T0, (run(T0, T0 + 10 + delay, exited=T0 + 10),))
        for i, delay in enumerate((0.05, 0.1, 0.15))
    ]
    out = replay_jobs(jobs)
    assert out.end_latency == pytest.approx(0.1)
    assert out.turn == pytest.approx(0.2)
    assert all(j.runs == ((10.0, SUCCEEDED),) for j in out.jobs)


def test_trace_csv_has_no_names_or_commands_and_replays() -> None:
    jobs = [
        recorded("j-1", T0 + 5, (run(T0 + 6, T0 + 16),), max_runtime=7200.0),
        recorded("j-2", T0 + 7, state="pending"),
        recorded("j-0", T0 - 50, (run(T0 - 40, T0 + 20),)),
    ]
    text, left_out = trace_csv(jobs, since=T0)
    assert left_out == 1
    assert "secret" not in text and "j-1" not in text
    (row,) = read_trace_rows(text.splitlines(), source="export")
    assert (row.job_id, row.submit_time, row.duration, row.gpus) == ("h1", 5.0, 10.0, 4000)
    assert row.max_runtime == 7200.0


# ------------------------------------------------------------------ the replay's extras


def test_a_failed_run_is_retried_then_succeeds(cluster: Cluster) -> None:
    job = trace("j", 0.0, runs=((5.0, FAILED), (7.0, SUCCEEDED)))
    result = Replay(cluster, [job], fifo()).run()
    (story,) = result.jobs
    assert [(a.start, a.end, a.outcome) for a in result.attempts] == [
        (0.0, 5.0, FAILED),
        (5.0, 12.0, SUCCEEDED),
    ]
    assert (story.end, story.outcome, story.attempts) == (12.0, SUCCEEDED, 2)


def test_withdrawn_jobs_leave_the_line_or_are_stopped(cluster: Cluster) -> None:
    jobs = [
        trace("busy", 0.0, duration=100.0),
        trace("waits", 1.0, withdraw_at=10.0),
        trace("runs", 200.0, duration=50.0, withdraw_at=220.0),
    ]
    result = Replay(cluster, jobs, fifo()).run()
    stories = {j.job_id: j for j in result.jobs}
    assert stories["waits"].first_start is None and stories["waits"].outcome == CANCELLED
    assert stories["runs"].outcome == CANCELLED and stories["runs"].end == 220.0
    ran = [a for a in result.attempts if a.job_id == "runs"]
    assert [(a.start, a.end, a.outcome) for a in ran] == [(200.0, 220.0, CANCELLED)]


def test_a_replay_stops_at_until_with_open_runs(cluster: Cluster) -> None:
    jobs = [trace("long", 0.0, runs=((math.inf, UNFINISHED),)), trace("late", 500.0)]
    result = Replay(cluster, jobs, fifo(), until=100.0).run()
    assert [(a.job_id, a.start, a.end) for a in result.attempts] == [("long", 0.0, None)]
    assert {j.job_id: j.first_start for j in result.jobs} == {"long": 0.0, "late": None}


def test_an_end_within_a_turn_of_the_last_is_seen_at_the_next_turn(cluster: Cluster) -> None:
    # The loop took a turn at 0 (j's start): j's end at 0.05 is seen, and its GPUs
    # freed, only at 0.2. k arrives to an idle loop, which takes its turn at once.
    jobs = [trace("j", 0.0, duration=0.05), trace("k", 5.0)]
    result = Replay(cluster, jobs, fifo(), turn=0.2).run()
    assert [(a.job_id, a.start, a.end) for a in result.attempts] == [
        ("j", 0.0, pytest.approx(0.2)),
        ("k", 5.0, 15.0),
    ]


def test_an_end_is_seen_its_latency_after_the_run(cluster: Cluster) -> None:
    # j's processes end at 10; the loop sees it, and frees the node, 0.1 s later.
    jobs = [trace("j", 0.0), trace("k", 0.0)]
    result = Replay(cluster, jobs, fifo(), end_latency=0.1).run()
    assert [(a.job_id, a.start, a.end) for a in result.attempts] == [
        ("j", 0.0, pytest.approx(10.1)),
        ("k", pytest.approx(10.1), pytest.approx(20.2)),
    ]


def test_submissions_within_a_turn_are_ordered_together(cluster: Cluster) -> None:
    # a2 would borrow team-b's node; b1, within team-b's guarantee, comes 50 ms later.
    # Seen one by one, a2 starts and b1 takes the node back from it; seen together at
    # the loop's next turn, b1 goes first and a2 waits, as the live loop would order them.
    jobs = [
        trace("a1", 0.0, duration=100.0),
        trace("a2", 0.05, duration=100.0),
        trace("b1", 0.1, queue="team-b", duration=100.0),
    ]
    one_by_one = Replay(cluster, jobs, parse_policy("default")).run()
    assert {j.job_id: j.first_start for j in one_by_one.jobs}["a2"] == 0.05
    assert one_by_one.preemptions == 1
    together = Replay(cluster, jobs, parse_policy("default"), turn=0.2).run()
    starts = {j.job_id: j.first_start for j in together.jobs}
    assert starts == {"a1": 0.0, "a2": 100.0, "b1": pytest.approx(0.2)}
    assert together.preemptions == 0


def test_a_configuration_change_takes_effect_when_applied(cluster: Cluster) -> None:
    # The first configuration has one node only: the second job waits until the
    # configuration with two nodes is applied at t=30.
    first = next(iter(cluster.nodes.values()))
    one_node = cluster.with_nodes({first.name: first})
    jobs = [trace("a", 0.0, duration=100.0), trace("b", 1.0, queue="team-b", duration=5.0)]
    result = Replay(one_node, jobs, parse_policy("default"), changes=[(30.0, cluster)]).run()
    assert {j.job_id: j.first_start for j in result.jobs} == {"a": 0.0, "b": 30.0}


def test_a_victim_holds_its_resources_while_it_stops(cluster: Cluster) -> None:
    # team-b borrows both nodes; team-a's job reclaims one and starts only once the
    # victim has stopped, 3 s after the preemption.
    jobs = [
        trace("b1", 0.0, queue="team-b", duration=1000.0),
        trace("b2", 0.0, queue="team-b", duration=1000.0),
        trace("a", 10.0, duration=5.0),
    ]
    result = Replay(cluster, jobs, parse_policy("default"), stop_latency=3.0).run()
    starts = {j.job_id: j.first_start for j in result.jobs}
    assert starts["a"] == 13.0
    preempted = [a for a in result.attempts if a.outcome == "preempted"]
    assert [(a.start, a.end) for a in preempted] == [(0.0, 13.0)]


# ------------------------------------------------------------------ the comparison


def test_a_proposal_without_a_jobs_queue_is_refused_naming_it(cluster: Cluster) -> None:
    jobs = [trace("a", 0.0), trace("x", 0.0, queue="gone")]
    with pytest.raises(InvalidInput, match="'gone' \\(1 job\\)"):
        fit_jobs(jobs, cluster, source="proposed.yaml")


def test_a_class_the_proposal_does_not_allow_becomes_the_queues_default(
    cluster: Cluster,
) -> None:
    fitted, moved = fit_jobs([trace("a", 0.0, priority_class="nope")], cluster, source="p")
    assert moved == 1 and fitted[0].priority_class is None


def test_compare_in_force_matches_a_recording_it_made_itself(cluster: Cluster) -> None:
    """A recording that is exactly what the replay does is replayed with no error."""
    jobs = [trace(f"j{i}", float(i), duration=10.0, queue="team-a") for i in range(6)]
    result = Replay(cluster, jobs, parse_policy("default")).run()
    history = [
        recorded(
            a.job_id,
            T0 + a.submit,
            (run(T0 + a.start, T0 + a.end),),
        )
        for a in result.attempts
        if a.start is not None and a.end is not None
    ]
    out = compare(
        history,
        since=T0,
        until=T0 + 100,
        in_force=[(0.0, cluster)],
        proposed=None,
        policy=parse_policy("default"),
    )
    (row,) = out["queues"]
    assert row["recorded"]["wait_avg_s"] == row["current"]["wait_avg_s"] > 0
    assert row["wait_error"] == 0.0 and out["fidelity"]["order_agreement"] == 1.0
    assert row["recorded"]["censored"] == 0 and row["recorded"]["jobs"] == 6
    assert row["proposed"] is None and out["worse"] == []


def test_compare_counts_jobs_not_started_by_the_end_as_censored(cluster: Cluster) -> None:
    history = [
        recorded("runs", T0, (run(T0, None, None),), state="running", count=2),
        recorded("waits", T0 + 10, state="pending"),
    ]
    out = compare(
        history,
        since=T0,
        until=T0 + 100,
        in_force=[(0.0, cluster)],
        proposed=cluster,
        policy=parse_policy("default"),
    )
    (row,) = out["queues"]
    for key in ("recorded", "current", "proposed"):
        assert row[key]["censored"] == 1, key
        assert row[key]["wait_p99_s"] == pytest.approx(90.0 * 0.99 + 0.0 * 0.01, abs=1)
        assert row[key]["utilization"] == 1.0


def test_worse_names_what_grows_beyond_noise() -> None:
    current = {"wait_avg_s": 10.0, "wait_p95_s": 10.0, "preemptions": 2}
    proposed = {"wait_avg_s": 20.0, "wait_p95_s": 10.4, "preemptions": 2}
    assert worse("q", current, proposed) == ["q: mean wait 10 s -> 20 s (+100%)"]


def test_order_agreement_is_one_for_the_same_order_and_minus_one_reversed(
    cluster: Cluster,
) -> None:
    history = [recorded(f"j{i}", T0, (run(T0 + i, T0 + i + 1),)) for i in range(5)]
    a = recorded_outcome(history, cluster)
    reversed_history = [
        replace(job, runs=(run(T0 + 10 - i, T0 + 11 - i),)) for i, job in enumerate(history)
    ]
    b = recorded_outcome(reversed_history, cluster)
    ids = [job.id for job in history]
    assert order_agreement(a, a, ids) == 1.0
    assert order_agreement(a, b, ids) == -1.0


def test_the_version_in_force_at_each_submission_takes_the_job(cluster: Cluster) -> None:
    """A queue added by a later version takes its jobs from then on; a job of a queue
    that no version has (a history older than the stored versions) is left out and
    counted, not an error."""
    without_b = load_cluster_text(
        TINY_CLUSTER.replace(
            "      - {name: team-b, quota: {a100: {gpu: 4, cpu: 32, memory: 256Gi}}}\n", ""
        ),
        source="v1",
    )
    history = [
        recorded("a", T0 + 1, (run(T0 + 1, T0 + 11),)),
        recorded("b", T0 + 60, (run(T0 + 60, T0 + 70),), queue="team-b"),
        recorded("x", T0 + 61, (run(T0 + 61, T0 + 71),), queue="gone"),
    ]
    out = compare(
        history,
        since=T0,
        until=T0 + 100,
        in_force=[(T0, without_b), (T0 + 50, cluster)],
        proposed=None,
        policy=parse_policy("default"),
    )
    rows = {row["name"]: row for row in out["queues"]}
    assert rows["team-b"]["current"]["wait_avg_s"] == 0.0
    assert rows["team-b"]["current"]["jobs"] == 1
    assert out["assumed"]["unknown_queue"] == 1


def test_two_processes_give_the_same_comparison_as_one(cluster: Cluster) -> None:
    history = [
        recorded(f"j{i}", T0 + i, (run(T0 + i, T0 + i + 30),), queue=("team-a", "team-b")[i % 2])
        for i in range(12)
    ]
    bigger = load_cluster_text(TINY_CLUSTER.replace("gpu: 4, cpu: 32", "gpu: 8, cpu: 32", 1))
    args: dict[str, Any] = {
        "since": T0,
        "until": T0 + 100,
        "in_force": [(0.0, cluster)],
        "proposed": bigger,
        "policy": parse_policy("default"),
    }
    one, two = compare(history, **args), compare(history, workers=2, **args)
    for out in (one, two):
        out.pop("replay_s")
    assert one == two
