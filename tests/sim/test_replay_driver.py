"""The replay driver's mechanics, with scripted schedulers standing in for the core."""

from __future__ import annotations

import gc
import io

import pytest

from allotment.domain.cluster import Cluster
from allotment.domain.reasons import Reason, ReasonCode
from allotment.scheduler.decisions import Admit, Decisions, Preempt, Victim
from allotment.scheduler.snapshot import PendingJob, ReplicaPlacement, Snapshot
from allotment.sim.jobs_out import write_attempts
from allotment.sim.metrics import summarize
from allotment.sim.policies import parse_policy
from allotment.sim.replay import YOUNG_COLLECTION_EVERY, Replay, ReplayError, replay
from allotment.sim.results import Attempt
from allotment.sim.trace import TraceJob

WAIT = Reason(ReasonCode.NO_NODE_FITS, "scripted")


def job(
    job_id: str,
    submit: float,
    duration: float,
    *,
    queue: str = "team-a",
    gpus: int = 4,
    replicas: int = 1,
    max_runtime: float | None = None,
) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        submit_time=submit,
        duration=duration,
        queue=queue,
        gpus=gpus * 1000,
        replicas=replicas,
        max_runtime=max_runtime,
    )


def admit(pending: PendingJob, node: str) -> Admit:
    placements = tuple(
        ReplicaPlacement(group=g.name, index=i, node=node, resources=dict(g.resources))
        for g in pending.replicas
        for i in range(g.count)
    )
    return Admit(job=pending.id, queue=pending.queue, pool="a100", placements=placements)


def one_node_fifo(snapshot: Snapshot) -> Decisions:
    """Runs one job at a time on n01, oldest first."""
    decisions = Decisions(now=snapshot.now)
    ordered = sorted(snapshot.pending, key=lambda j: (j.submit_time, j.id))
    busy = any(p.node == "n01" for r in snapshot.running for p in r.placements)
    for i, pending in enumerate(ordered):
        if i == 0 and not busy:
            decisions.admitted.append(admit(pending, "n01"))
        else:
            decisions.waiting[pending.id] = WAIT
    return decisions


def csv_rows(attempts: list[Attempt]) -> list[list[str]]:
    out = io.StringIO()
    write_attempts(attempts, out)
    return [line.split(",") for line in out.getvalue().splitlines()]


def test_jobs_run_for_their_true_duration(tiny_cluster: Cluster) -> None:
    result = replay(
        tiny_cluster,
        [job("a", 0, 100), job("b", 10, 50)],
        parse_policy("default"),
        scheduler=one_node_fifo,
    )
    a, b = result.jobs
    assert (a.first_start, a.end, a.outcome) == (0, 100, "succeeded")
    assert (b.first_start, b.end, b.outcome) == (100, 150, "succeeded")
    assert csv_rows(result.attempts) == [
        ["job_id", "queue", "submit_s", "start_s", "end_s", "gpus", "nodes", "outcome"],
        ["a", "team-a", "0", "0", "100", "4", "n01:4", "succeeded"],
        ["b", "team-a", "10", "100", "150", "4", "n01:4", "succeeded"],
    ]
    summary = summarize(result)
    assert summary["jobs"] == 2
    assert summary["wait_avg_s"] == 45.0
    assert summary["jct_avg_s"] == (100 + 140) / 2
    assert summary["makespan_s"] == 150
    assert summary["utilization"] == round(4 * 150 / (8 * 150), 4)
    assert summary["per_queue"]["team-a"]["jobs"] == 2


def test_time_scale_multiplies_submit_times(tiny_cluster: Cluster) -> None:
    result = replay(
        tiny_cluster,
        [job("a", 0, 10), job("b", 100, 10)],
        parse_policy("default"),
        scheduler=one_node_fifo,
        time_scale=0.5,
    )
    assert [j.submit for j in result.jobs] == [0, 50]
    assert result.jobs[1].first_start == 50


def test_max_runtime_stops_a_job_as_failed(tiny_cluster: Cluster) -> None:
    result = replay(
        tiny_cluster,
        [job("a", 0, 500, max_runtime=60)],
        parse_policy("default"),
        scheduler=one_node_fifo,
    )
    (a,) = result.jobs
    assert (a.end, a.outcome) == (60, "failed")
    assert result.attempts[0].outcome == "failed"


def test_same_instant_events_make_one_cycle(tiny_cluster: Cluster) -> None:
    seen: list[tuple[float, int]] = []

    def spy(snapshot: Snapshot) -> Decisions:
        seen.append((snapshot.now, len(snapshot.pending)))
        return one_node_fifo(snapshot)

    replay(
        tiny_cluster,
        [job("a", 0, 10), job("b", 0, 10), job("c", 0, 10)],
        parse_policy("default"),
        scheduler=spy,
    )
    # t=0: one cycle admits a, the repeat admits nothing; then one cycle per completion.
    assert seen[:2] == [(0, 3), (0, 2)]
    assert [t for t, _ in seen].count(10) == 2


def test_preemption_requeues_the_victim(tiny_cluster: Cluster) -> None:
    """b (team-b) preempts a (team-a) at t=5; a restarts when b ends."""

    def scripted(snapshot: Snapshot) -> Decisions:
        decisions = Decisions(now=snapshot.now)
        running = {r.id for r in snapshot.running}
        pending = {p.id: p for p in snapshot.pending}
        if "b" in pending and "a" in running:
            victim = Victim(job="a", queue="team-a", cause="reclaim", message="b needs it")
            decisions.preemptions.append(
                Preempt(
                    job="b",
                    queue="team-b",
                    pool="a100",
                    victims=(victim,),
                    reason=Reason(ReasonCode.WAITING_FOR_PREEMPTION, "b waits"),
                )
            )
            decisions.waiting["b"] = decisions.preemptions[0].reason
        elif not running and pending:
            first = min(pending.values(), key=lambda p: (p.id != "b", p.submit_time))
            decisions.admitted.append(admit(first, "n01"))
        return decisions

    result = replay(
        tiny_cluster,
        [job("a", 0, 100), job("b", 5, 10, queue="team-b")],
        parse_policy("default"),
        scheduler=scripted,
    )
    a, b = result.jobs
    assert result.preemptions == 1
    assert (a.first_start, a.end, a.outcome, a.preempted, a.attempts) == (0, 115, "succeeded", 1, 2)
    assert (b.first_start, b.end) == (5, 15)
    assert [(x.job_id, x.attempt, x.start, x.end, x.outcome) for x in result.attempts] == [
        ("a", 1, 0, 5, "preempted"),
        ("b", 1, 5, 15, "succeeded"),
        ("a", 2, 15, 115, "succeeded"),
    ]
    assert summarize(result)["preemptions"] == 1
    assert summarize(result)["per_queue"]["team-a"]["preemptions"] == 1


def test_never_started_jobs_are_unfinished(tiny_cluster: Cluster) -> None:
    def never(snapshot: Snapshot) -> Decisions:
        decisions = Decisions(now=snapshot.now)
        for p in snapshot.pending:
            decisions.waiting[p.id] = WAIT
        return decisions

    result = replay(tiny_cluster, [job("a", 3, 10)], parse_policy("default"), scheduler=never)
    (a,) = result.jobs
    assert a.outcome == "unfinished"
    assert csv_rows(result.attempts)[1] == ["a", "team-a", "3", "", "", "4", "", "unfinished"]
    summary = summarize(result)
    assert summary["unfinished"] == 1
    assert summary["jct_avg_s"] is None
    assert summary["wait_avg_s"] is None


def test_a_replay_collects_garbage_less_often_and_puts_it_back(tiny_cluster: Cluster) -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    def watching(snapshot: Snapshot) -> Decisions:
        seen.append(gc.get_threshold())
        return one_node_fifo(snapshot)

    replay(tiny_cluster, [job("a", 0, 10)], parse_policy("default"), scheduler=watching)
    assert seen and seen[0] == (YOUNG_COLLECTION_EVERY, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(ReplayError):  # also when the replay fails
        replay(
            tiny_cluster,
            [job("a", 0, 10), job("b", 0, 10)],
            parse_policy("default"),
            scheduler=lambda s: Decisions(now=s.now, admitted=[admit(p, "n01") for p in s.pending]),
        )
    assert gc.get_threshold() == before


def test_over_commit_is_caught(tiny_cluster: Cluster) -> None:
    def greedy_on_n01(snapshot: Snapshot) -> Decisions:
        return Decisions(now=snapshot.now, admitted=[admit(p, "n01") for p in snapshot.pending])

    with pytest.raises(ReplayError, match="over-commits gpu on node n01"):
        replay(
            tiny_cluster,
            [job("a", 0, 10), job("b", 0, 10)],
            parse_policy("default"),
            scheduler=greedy_on_n01,
        )


def test_admitting_a_running_job_is_caught(tiny_cluster: Cluster) -> None:
    first: list[Admit] = []

    def twice(snapshot: Snapshot) -> Decisions:
        if not first:
            first.append(admit(snapshot.pending[0], "n01"))
            return Decisions(now=snapshot.now, admitted=list(first))
        return Decisions(now=snapshot.now, admitted=list(first))

    with pytest.raises(ReplayError, match="admitted job a, which is running"):
        replay(
            tiny_cluster,
            [job("a", 0, 10), job("b", 1, 10)],
            parse_policy("default"),
            scheduler=twice,
        )


def test_gangs_start_whole(tiny_cluster: Cluster) -> None:
    def half(snapshot: Snapshot) -> Decisions:
        full = admit(snapshot.pending[0], "n01")
        partial = Admit(
            job=full.job, queue=full.queue, pool=full.pool, placements=full.placements[:1]
        )
        return Decisions(now=snapshot.now, admitted=[partial])

    with pytest.raises(ReplayError, match="placed 1 of job a's 2 replicas"):
        replay(
            tiny_cluster,
            [job("a", 0, 10, gpus=1, replicas=2)],
            parse_policy("default"),
            scheduler=half,
        )


def test_the_scheduler_never_sees_true_durations(tiny_cluster: Cluster) -> None:
    expected: list[float | None] = []
    ends: list[float | None] = []

    def spy(snapshot: Snapshot) -> Decisions:
        expected.extend(p.expected_runtime for p in snapshot.pending)
        ends.extend(r.expected_end for r in snapshot.running)
        return one_node_fifo(snapshot)

    jobs = [job("a", 0, 100, max_runtime=200), job("b", 1, 30)]
    replay(tiny_cluster, jobs, parse_policy("default"), scheduler=spy)
    assert expected and set(expected) == {None}
    assert ends and set(ends) == {None}

    expected.clear()
    ends.clear()
    replay(tiny_cluster, jobs, parse_policy("default+oracle"), scheduler=spy)
    assert 100 in expected and 30 in expected
    assert 100 in ends


def test_replay_object_runs_with_default_priority_class(tiny_cluster: Cluster) -> None:
    seen: list[str] = []

    def spy(snapshot: Snapshot) -> Decisions:
        seen.extend(p.priority_class for p in snapshot.pending)
        return one_node_fifo(snapshot)

    Replay(tiny_cluster, [job("a", 0, 1)], parse_policy("default"), scheduler=spy).run()
    assert seen == ["training"]
