"""Replays on the incremental core (the default): the same schedule as whole snapshots,
guarantee shortfalls, start forecasts and progress."""

from __future__ import annotations

from dataclasses import replace

import pytest

from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.sim.metrics import summarize
from allotment.sim.policies import PRESETS, parse_policy
from allotment.sim.replay import Replay, replay
from allotment.sim.results import Shortfall
from allotment.sim.trace import TraceJob


def job(job_id: str, submit: float, duration: float, queue: str, gpus: float) -> TraceJob:
    return TraceJob(
        job_id=job_id, submit_time=submit, duration=duration, queue=queue, gpus=int(gpus * 1000)
    )


WORK = [
    job("b1", 0, 100, "team-b", 4),
    job("b2", 0, 100, "team-b", 4),
    job("a1", 10, 50, "team-a", 4),
    job("a2", 20, 30, "team-a", 2),
    job("b3", 30, 40, "team-b", 1),
    job("a3", 200, 10, "team-a", 0.5),
]


@pytest.mark.parametrize("policy", [*PRESETS, "default+oracle"])
def test_the_session_schedules_as_whole_snapshots_do(tiny_cluster: Cluster, policy: str) -> None:
    incremental = replay(tiny_cluster, WORK, parse_policy(policy))
    reference = replay(tiny_cluster, WORK, parse_policy(policy), scheduler=schedule_once)
    assert [(a.job_id, a.start, a.end, a.outcome) for a in incremental.attempts] == [
        (a.job_id, a.start, a.end, a.outcome) for a in reference.attempts
    ]
    assert incremental.shortfalls is not None and reference.shortfalls is None


def test_a_queue_owed_its_guarantee_is_a_shortfall_until_it_gets_it(
    tiny_cluster: Cluster,
) -> None:
    """team-b borrows team-a's node at t=0; team-a asks for it at t=10. Without reclaim it
    waits until t=100 (one shortfall of 90 s); with reclaim it gets it at once."""
    work = WORK[:3]
    keep = SchedulerPolicy(name="keep", borrowing=True, reclaim=False, preemption=False)
    kept = replay(tiny_cluster, work, keep)
    assert kept.shortfalls == [Shortfall(queue="team-a", start=10, end=100)]
    summary = summarize(kept)
    assert (summary["guarantee_violations"], summary["guarantee_shortfall_s"]) == (1, 90)
    assert summary["per_queue"]["team-a"]["guarantee_violations"] == 1
    assert summary["per_queue"]["team-b"]["guarantee_violations"] == 0
    assert summary["wait_max_s"] == 90

    reclaimed = replay(tiny_cluster, work, parse_policy("borrowing"))
    assert reclaimed.shortfalls == []
    assert summarize(reclaimed)["guarantee_violations"] == 0
    a1 = next(j for j in reclaimed.jobs if j.job_id == "a1")
    assert a1.first_start == 10


CROSSED = """
pools:
  - {name: pa}
  - {name: pb}
nodes:
  - {name_prefix: a, count: 10, pool: pa, capacity: {gpu: 8, cpu: 64, memory: 512Gi}}
  - {name_prefix: b, count: 10, pool: pb, capacity: {gpu: 8, cpu: 64, memory: 512Gi}}
queues:
  - name: org
    children:
      - {name: team-a, quota: {pa: {gpu: 80, cpu: 640, memory: 5120Gi}}}
      - {name: team-b, quota: {pb: {gpu: 80, cpu: 640, memory: 5120Gi}}}
"""
"""Two pools of 80 GPUs, each one team's guarantee."""

CROSSED_WORK = [
    # team-a fills its own pool for 100 s, and borrows all of team-b's for long.
    *(job(f"a-short-{k}", 0, 100, "team-a", 1) for k in range(80)),
    *(job(f"a-long-{k}", 1, 10_000, "team-a", 1) for k in range(80)),
    # Then team-b, finding its own pool full, borrows all of team-a's.
    *(job(f"b-long-{k}", 200, 10_000, "team-b", 1) for k in range(80)),
    # team-a takes one GPU back at home: its victim, requeued, takes one back in
    # team-b's pool, whose victim takes one back in team-a's, and so on.
    job("a-new", 300, 10_000, "team-a", 1),
]


def test_a_chain_of_reclaims_plays_out_at_its_instant() -> None:
    """Each hop of the chain is one cycle; the replay runs them all at t=300, as the live
    loop runs cycle after cycle, so no queue is left short of its guarantee. Cut at 64
    cycles (as the replay once was), both stayed short until the next event, 9,701 s on,
    and the replay says it was cut."""
    cluster = load_cluster_text(CROSSED, source="crossed")
    result = Replay(cluster, CROSSED_WORK, parse_policy("borrowing")).run()
    summary = summarize(result)
    assert (summary["guarantee_violations"], summary["instants_cut"]) == (0, 0)
    starts = {a.job_id for a in result.attempts if a.start == 300}
    assert "a-new" in starts

    cut = Replay(cluster, CROSSED_WORK, parse_policy("borrowing"), max_cycles_per_instant=64)
    summary = summarize(cut.run())
    assert summary["instants_cut"] == 1
    assert summary["guarantee_violations"] == 2
    assert summary["guarantee_shortfall_max_s"] == 9_701


def test_sampled_jobs_get_a_start_forecast(tiny_cluster: Cluster) -> None:
    """Ten 4-GPU team-a jobs of 100 s, one every second, on fifo-isolated: one node, so
    they run one after another. Once a few have finished, the forecast knows they take
    100 s and predicts the later starts exactly."""
    work = [job(f"j{i}", i, 100, "team-a", 4) for i in range(10)]
    work += [job(f"k{i}", 1000 + i, 100, "team-a", 4) for i in range(12)]
    result = Replay(tiny_cluster, work, parse_policy("fifo-isolated"), predict_every=1).run()
    by_id = {j.job_id: j for j in result.jobs}
    assert all(j.sampled for j in result.jobs)
    # No history yet: the first ones cannot be told (the first starts at once).
    assert by_id["j0"].predicted_start == 0
    assert by_id["j1"].predicted_start is None
    # After ten finished jobs of 100 s, every forecast is exact.
    for i in range(1, 12):
        late = by_id[f"k{i}"]
        assert late.predicted_start == late.first_start == 1000 + 100 * i
    stats = summarize(result)
    assert stats["forecast_samples"] == 22
    assert stats["forecast_long_error_median"] == 0.0
    assert stats["forecast_s"] is not None


def test_sampled_jobs_with_a_limit_are_forecast_from_the_share_of_it_jobs_used(
    tiny_cluster: Cluster,
) -> None:
    """Twenty 4-GPU team-a jobs of 100 s declare 400 s; the forecaster learns that jobs
    use a quarter of their limit, and foresees twelve more declaring 800 s (200 s each)."""
    work = [replace(job(f"j{i}", i, 100, "team-a", 4), max_runtime=400) for i in range(20)]
    work += [replace(job(f"k{i}", 3000 + i, 200, "team-a", 4), max_runtime=800) for i in range(12)]
    replayed = Replay(tiny_cluster, work, parse_policy("fifo-isolated"), predict_every=1)
    result = replayed.run()
    history = replayed.forecaster.history
    assert history.runtime("team-a", 4000, limit=800) == pytest.approx(200)
    by_id = {j.job_id: j for j in result.jobs}
    for i in range(1, 12):
        late = by_id[f"k{i}"]
        assert late.predicted_start == late.first_start == 3000 + 200 * i


def test_a_trace_that_names_users_is_forecast_from_each_users_runs(
    tiny_cluster: Cluster,
) -> None:
    """ada's 4-GPU jobs run 300 s and bob's 50 s, one after another on team-a's node.
    Named, each later job's start is foreseen exactly from its own user's runs and those
    of the users ahead of it; unnamed, the queue's mix of both is wrong for both."""

    def work(named: bool) -> list[TraceJob]:
        out = []
        for i, at in [*enumerate(range(20)), *enumerate(range(5000, 5008), start=20)]:
            user = "ada" if i % 2 == 0 else "bob"
            ran = job(f"j{i}", at, 300 if user == "ada" else 50, "team-a", 4)
            out.append(replace(ran, user=user if named else None))
        return out

    def late(named: bool) -> list[tuple[float | None, float | None]]:
        result = Replay(tiny_cluster, work(named), parse_policy("fifo-isolated"), predict_every=1)
        by_id = {j.job_id: j for j in result.run().jobs}
        return [(by_id[f"j{i}"].predicted_start, by_id[f"j{i}"].first_start) for i in range(21, 28)]

    assert all(predicted == started for predicted, started in late(named=True))
    assert all(predicted != started for predicted, started in late(named=False))


def test_progress_is_reported_per_thousand_arrivals(tiny_cluster: Cluster) -> None:
    work = [job(f"j{i}", i, 1, "team-a", 0.5) for i in range(2500)]
    seen: list[tuple[int, int]] = []
    Replay(
        tiny_cluster,
        work,
        parse_policy("fifo-isolated"),
        progress=lambda done, total: seen.append((done, total)),
    ).run()
    assert seen == [(1000, 2500), (2000, 2500)]


GANG_BEHIND = """
pools:
  - {name: gpu}
nodes:
  - {name_prefix: n, count: 3, pool: gpu, capacity: {gpu: 8}}
queues:
  - name: org
    children:
      - {name: team-a, quota: {gpu: {gpu: 8}}}
      - {name: team-d, quota: {gpu: {gpu: 16}}}
"""
"""Three 8-GPU nodes: team-a guaranteed one, team-d two."""

GANG_BEHIND_WORK = [
    job("a-first", 0, 1_000, "team-a", 8),
    job("d-first", 0, 1_000, "team-d", 8),
    # team-d's gang finds one whole node free, and no quota: it waits, and its queue's
    # younger 1-GPU jobs start in the free node behind it.
    replace(job("d-gang", 10, 20_000, "team-d", 8), replicas=2),
    *(job(f"d-small-{k}", 20, 50_000, "team-d", 1) for k in range(4)),
    # At 1,000 s the gang starts, borrowing 4 GPUs of team-a's idle guarantee; at 1,100 s
    # team-a wants its node back.
    job("a-back", 1_100, 1_000, "team-a", 8),
]


def test_protect_spares_a_gang_that_borrowed_only_because_younger_jobs_held_its_guarantee() -> None:
    """By work lost alone, reclaim takes the gang (16 GPUs for 100 s, against four 1-GPU
    jobs for 1,080 s each), though it is team-d's earliest work and its younger jobs are
    what team-d borrows; on a busy fleet the gang is taken again each time it starts.
    With ``protect`` the younger jobs go, and the gang runs to its end at once."""
    cluster = load_cluster_text(GANG_BEHIND, source="gang-behind")
    plain, spared = (
        {j.job_id: j for j in replay(cluster, GANG_BEHIND_WORK, parse_policy(name)).jobs}
        for name in ("fair-share", "fair-share+protect")
    )
    for result in (plain, spared):
        assert result["a-back"].first_start == 1_100  # team-a's guarantee, at once
    assert plain["d-gang"].preempted == 1
    assert all(plain[f"d-small-{k}"].preempted == 0 for k in range(4))
    assert spared["d-gang"].preempted == 0
    assert spared["d-gang"].end == 1_000 + 20_000
    assert sum(spared[f"d-small-{k}"].preempted for k in range(4)) == 4
