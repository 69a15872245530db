"""Replays on the real core whose answers are worked out by hand.

Each trace is a handful of jobs on a cluster of two 4-GPU nodes; the expected start and
end of every attempt follows from the documented semantics (sim/replay.py, the README's
"How the scheduler decides"), not from running the code. Where a number depends on a
rule, the test's docstring says which.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace

import pytest

from allotment.domain.cluster import Cluster
from allotment.domain.loading import load_cluster_text
from allotment.domain.reasons import Reason, ReasonCode
from allotment.scheduler.cycle import schedule_once
from allotment.scheduler.decisions import Admit, Decisions
from allotment.scheduler.snapshot import Snapshot
from allotment.sim.jobs_out import write_attempts
from allotment.sim.metrics import summarize
from allotment.sim.policies import PRESETS, parse_policy
from allotment.sim.replay import replay
from allotment.sim.results import ReplayResult
from allotment.sim.trace import TraceJob

ISOLATED = ["fifo-isolated", "backfill"]
"""The presets without borrowing: every queue keeps to its own quota."""
BORROWING = ["borrowing", "fair-share", "default"]
"""The presets that lend idle quota."""

ONE_QUEUE = """
pools:
  - {name: a100}
nodes:
  - {name_prefix: n, count: 2, pool: a100, capacity: {gpu: 4}}
queues:
  - {name: team-a, quota: {a100: {gpu: 8}}}
"""
"""Two 4-GPU nodes and one queue guaranteed all eight GPUs: only free capacity limits it."""


def job(
    job_id: str,
    submit: float,
    duration: float,
    *,
    queue: str = "team-a",
    gpus: float = 4,
    replicas: int = 1,
    max_runtime: float | None = None,
) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        submit_time=submit,
        duration=duration,
        queue=queue,
        gpus=round(gpus * 1000),
        replicas=replicas,
        max_runtime=max_runtime,
    )


def run(
    cluster: Cluster, jobs: list[TraceJob], policy: str, *, time_scale: float = 1.0
) -> ReplayResult:
    return replay(cluster, jobs, parse_policy(policy), time_scale=time_scale)


def spans(result: ReplayResult) -> dict[str, list[tuple[float | None, float | None, str]]]:
    """Each job's attempts in order: (start, end, outcome)."""
    out: dict[str, list[tuple[float | None, float | None, str]]] = {}
    for a in sorted(result.attempts, key=lambda a: (a.job_id, a.attempt)):
        out.setdefault(a.job_id, []).append((a.start, a.end, a.outcome))
    return out


def rows(result: ReplayResult) -> dict[str, list[dict[str, str]]]:
    """The ``--jobs-out`` rows, by job."""
    out = io.StringIO()
    write_attempts(result.attempts, out)
    by_job: dict[str, list[dict[str, str]]] = {}
    for row in csv.DictReader(io.StringIO(out.getvalue())):
        by_job.setdefault(row["job_id"], []).append(row)
    return by_job


class Spy:
    """The real core, remembering each job's latest waiting reason and admission."""

    def __init__(self) -> None:
        self.reasons: dict[str, Reason] = {}
        self.admits: dict[str, Admit] = {}

    def __call__(self, snapshot: Snapshot) -> Decisions:
        decisions = schedule_once(snapshot)
        self.reasons.update(decisions.waiting.items())
        for admit in decisions.admitted:
            self.admits[admit.job] = admit
        return decisions


def spied(cluster: Cluster, jobs: list[TraceJob], policy: str) -> tuple[ReplayResult, Spy]:
    """Replay with a :class:`Spy` for the core; the replay with the default scheduler
    must give the same attempts."""
    spy = Spy()
    result = replay(cluster, jobs, parse_policy(policy), scheduler=spy)
    assert spans(run(cluster, jobs, policy)) == spans(result)
    return result, spy


def test_the_presets_are_split_by_borrowing() -> None:
    assert sorted(ISOLATED + BORROWING) == sorted(PRESETS)
    assert [parse_policy(p).borrowing for p in ISOLATED + BORROWING] == [False] * 2 + [True] * 3


# -- (a), (b): three jobs of one queue, the other queue idle --------------------------

THREE = [job("a1", 0, 10), job("a2", 0, 20), job("a3", 0, 30)]


@pytest.mark.parametrize("policy", ISOLATED)
def test_isolated_queue_runs_one_4_gpu_job_at_a_time(tiny_cluster: Cluster, policy: str) -> None:
    """team-a's quota is one node: a1, a2, a3 run back to back though n02 is idle."""
    result = run(tiny_cluster, THREE, policy)
    assert spans(result) == {
        "a1": [(0, 10, "succeeded")],
        "a2": [(10, 30, "succeeded")],
        "a3": [(30, 60, "succeeded")],
    }
    summary = summarize(result)
    assert summary["wait_avg_s"] == round((0 + 10 + 30) / 3, 3)
    assert summary["jct_avg_s"] == round((10 + 30 + 60) / 3, 3)
    assert summary["makespan_s"] == 60
    assert summary["utilization"] == round(4 * (10 + 20 + 30) / (8 * 60), 4)
    assert summary["preemptions"] == 0


@pytest.mark.parametrize("policy", BORROWING)
def test_borrowing_uses_the_idle_queue_s_node(tiny_cluster: Cluster, policy: str) -> None:
    """a2 borrows team-b's idle node at once; a3 takes the first node that frees (t=10)."""
    result = run(tiny_cluster, THREE, policy)
    assert spans(result) == {
        "a1": [(0, 10, "succeeded")],
        "a2": [(0, 20, "succeeded")],
        "a3": [(10, 40, "succeeded")],
    }
    summary = summarize(result)
    assert summary["wait_avg_s"] == round((0 + 0 + 10) / 3, 3)
    assert summary["jct_avg_s"] == round((10 + 20 + 40) / 3, 3)
    assert summary["makespan_s"] == 40
    assert summary["utilization"] == round(4 * (10 + 20 + 30) / (8 * 40), 4)


# -- (c): reclaim ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", BORROWING)
def test_reclaim_preempts_the_borrower_which_restarts_from_scratch(
    tiny_cluster: Cluster, policy: str
) -> None:
    """a1 runs on team-a's own quota, a2 (started later) on team-b's lent node. When b1
    arrives at t=30, team-b reclaims its quota: the most recently started borrower a2
    stops at 30 (``preempted``) and b1 starts at its submit time. a2 goes back to pending
    with its original submit time and restarts when b1 ends (t=80), borrowing again, and
    runs its whole duration again (no checkpoint): 80 + 100 = 180."""
    work = [
        job("a1", 0, 100),
        job("a2", 5, 100),
        job("b1", 30, 50, queue="team-b"),
    ]
    result = run(tiny_cluster, work, policy)
    assert spans(result) == {
        "a1": [(0, 100, "succeeded")],
        "a2": [(5, 30, "preempted"), (80, 180, "succeeded")],
        "b1": [(30, 80, "succeeded")],
    }
    assert [(r["submit_s"], r["start_s"], r["end_s"]) for r in rows(result)["a2"]] == [
        ("5", "5", "30"),
        ("5", "80", "180"),
    ]
    a2 = {j.job_id: j for j in result.jobs}["a2"]
    assert (a2.submit, a2.first_start, a2.end, a2.attempts, a2.preempted) == (5, 5, 180, 2, 1)
    assert a2.gpu_seconds == 4000 * (25 + 100)
    assert a2.lost_gpu_seconds == 4000 * 25  # its first 25 s on 4 GPUs, thrown away
    assert result.preemptions == 1
    summary = summarize(result)
    assert summary["preemptions"] == 1
    assert summary["lost_gpu_hours"] == round(4 * 25 / 3600, 3)
    held = 4 * (100 + 25 + 100 + 50)
    assert summary["gpu_hours"] == round(held / 3600, 3)
    assert summary["lost_share"] == round(4 * 25 / held, 4)
    assert summary["restarts_max"] == 1
    assert summary["per_queue"]["team-a"]["lost_gpu_hours"] == round(4 * 25 / 3600, 3)
    assert summary["per_queue"]["team-b"]["lost_gpu_hours"] == 0
    assert summary["per_queue"]["team-b"]["restarts_max"] == 0
    assert summary["per_queue"]["team-a"]["preemptions"] == 1
    assert summary["per_queue"]["team-b"]["preemptions"] == 0
    assert summary["wait_avg_s"] == 0  # wait is first start - submit
    assert summary["jct_avg_s"] == round((100 + 175 + 50) / 3, 3)


@pytest.mark.parametrize("policy", BORROWING)
def test_a_borrower_taken_back_twice_counts_two_restarts_and_its_lost_work(
    tiny_cluster: Cluster, policy: str
) -> None:
    """As above, and team-b reclaims its node a second time: a2 borrows at 5, stops at
    30 for b1, borrows again when b1 ends at 50, stops at 60 for b2, and runs whole from
    80. The summary shows the churn: two restarts of one job, and its 25 + 10 s on 4
    GPUs thrown away."""
    work = [
        job("a1", 0, 100),
        job("a2", 5, 100),
        job("b1", 30, 20, queue="team-b"),
        job("b2", 60, 20, queue="team-b"),
    ]
    result = run(tiny_cluster, work, policy)
    assert spans(result)["a2"] == [
        (5, 30, "preempted"),
        (50, 60, "preempted"),
        (80, 180, "succeeded"),
    ]
    summary = summarize(result)
    assert summary["restarts_max"] == 2
    assert summary["lost_gpu_hours"] == round(4 * (25 + 10) / 3600, 3)
    assert summary["per_queue"]["team-a"]["restarts_max"] == 2
    assert summary["per_queue"]["team-b"]["restarts_max"] == 0


def test_isolated_queues_never_preempt(tiny_cluster: Cluster) -> None:
    """Without borrowing nothing is lent, so nothing is reclaimed: a2 waits for a1."""
    work = [job("a1", 0, 100), job("a2", 5, 100), job("b1", 30, 50, queue="team-b")]
    for policy in ISOLATED:
        result = run(tiny_cluster, work, policy)
        assert spans(result) == {
            "a1": [(0, 100, "succeeded")],
            "a2": [(100, 200, "succeeded")],
            "b1": [(30, 80, "succeeded")],
        }, policy
        summary = summarize(result)
        assert (summary["lost_gpu_hours"], summary["lost_share"], summary["restarts_max"]) == (
            0,
            0,
            0,
        )


# -- (d): strict FIFO and backfill ---------------------------------------------------------

BLOCKED_HEAD = [
    job("f1", 0, 1000, gpus=3),  # n01: 1 GPU left, for good
    job("f2", 1, 50, gpus=2, max_runtime=60),  # n02: 2 GPUs left until t=51 (bound: 61)
    job("h", 2, 10, gpus=3),  # the head: 5 + 3 <= 8 quota, but no node has 3 free
    job("s1", 3, 5, gpus=2, max_runtime=20),  # fits n02 now; bounded to end by t=23
    job("s2", 10, 5, gpus=2, max_runtime=100),  # fits n02 now; may run until t=110
]


def test_strict_fifo_blocks_small_jobs_behind_a_big_head() -> None:
    """fifo-isolated: h is short of free capacity (not of quota) and blocks its queue, so
    s1 and s2 wait although n02 has room for them. f2 ends at 51: h starts on n02 (1 GPU
    left), s1 still does not fit and blocks s2. h ends at 61: s1 and s2 start."""
    result = run(load_cluster_text(ONE_QUEUE), BLOCKED_HEAD, "fifo-isolated")
    assert spans(result) == {
        "f1": [(0, 1000, "succeeded")],
        "f2": [(1, 51, "succeeded")],
        "h": [(51, 61, "succeeded")],
        "s1": [(61, 66, "succeeded")],
        "s2": [(61, 66, "succeeded")],
    }
    assert summarize(result)["wait_avg_s"] == round((0 + 0 + 49 + 58 + 51) / 5, 3)


def test_backfill_runs_a_job_ahead_only_if_it_ends_before_the_reservation() -> None:
    """backfill: h gets a reservation on n02 for t=61 (f2's max_runtime runs out then).
    s1 is bounded to end by 3 + 20 = 23 <= 61, so it runs ahead at once. s2 would end by
    10 + 100 = 110 > 61 and fits only on the reserved n02, so it waits; after h starts
    at 51 there is no room for it until h ends at 61."""
    result = run(load_cluster_text(ONE_QUEUE), BLOCKED_HEAD, "backfill")
    assert spans(result) == {
        "f1": [(0, 1000, "succeeded")],
        "f2": [(1, 51, "succeeded")],
        "h": [(51, 61, "succeeded")],
        "s1": [(3, 8, "succeeded")],
        "s2": [(61, 66, "succeeded")],
    }
    assert summarize(result)["wait_avg_s"] == round((0 + 0 + 49 + 0 + 51) / 5, 3)


NODE_DOWN = """
pools:
  - {name: a100}
nodes:
  - {name_prefix: n, count: 2, pool: a100, capacity: {gpu: 4}}
  - {name: n03, pool: a100, capacity: {gpu: 4}, healthy: false}
queues:
  - {name: team-a, quota: {a100: {gpu: 12}}}
"""
"""Three 4-GPU nodes with one down: the queue's quota (12) is more than the pool holds (8),
so the pool's capacity, not the quota, is what a job waits for."""


BLOCKED_BY_A_FULL_POOL = [
    job("f1", 0, 1000, gpus=4),
    job("f2", 1, 50, gpus=2, max_runtime=60),
    job("h", 2, 10, gpus=3),
    job("s", 10, 100, gpus=2, max_runtime=100),
]


def test_backfill_reserves_for_a_head_blocked_by_a_full_pool() -> None:
    """The trace of the backfill test with a bigger quota: h is short of free capacity,
    so it gets a reservation on n02 for t=61 (README, Backfill). s (2 GPUs, bounded to
    end by 110 > 61) fits only on n02, so it must wait; h starts at 51, s at 61."""
    result = run(load_cluster_text(NODE_DOWN), BLOCKED_BY_A_FULL_POOL, "backfill")
    assert spans(result)["h"] == [(51, 61, "succeeded")]
    assert spans(result)["s"] == [(61, 161, "succeeded")]


def test_default_reserves_only_for_a_job_that_has_waited_long() -> None:
    """Under ``default`` (reclaim on) a job reserves only once it has waited
    ``reserve_after``: h, blocked for 8 s, holds nothing, so s takes n02 at once and h
    starts when s ends. With ``reserve_after`` below h's wait, h reserves as under
    ``backfill``."""
    cluster = load_cluster_text(NODE_DOWN)
    result = run(cluster, BLOCKED_BY_A_FULL_POOL, "default")
    assert spans(result)["s"] == [(10, 110, "succeeded")]
    assert spans(result)["h"] == [(110, 120, "succeeded")]
    policy = replace(parse_policy("default"), reserve_after=5.0)
    result = replay(cluster, BLOCKED_BY_A_FULL_POOL, policy)
    assert spans(result)["h"] == [(51, 61, "succeeded")]
    assert spans(result)["s"] == [(61, 161, "succeeded")]


# -- (e): gangs --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_gang_starts_whole_or_not_at_all(tiny_cluster: Cluster, policy: str) -> None:
    """From t=5, 4 GPUs are free (1 on n01, 3 on n02) and team-a's quota of 4 is unused,
    but the gang of 2 x 2 GPUs cannot put both replicas down: it waits, whole, until b1
    frees n01 at t=100, then holds all 4 GPUs."""
    work = [
        job("b1", 0, 100, queue="team-b", gpus=3),  # n01
        job("a0", 0, 5, gpus=1),  # n01 (best fit), so n01 is full until t=5
        job("b2", 1, 100, queue="team-b", gpus=1),  # n02
        job("g", 6, 20, gpus=2, replicas=2),
    ]
    result = run(tiny_cluster, work, policy)
    assert spans(result)["g"] == [(100, 120, "succeeded")]
    (attempt,) = [a for a in result.attempts if a.job_id == "g"]
    assert attempt.gpus == 4000
    assert sum(g for _, g in attempt.nodes) == 4000
    assert all(g % 2000 == 0 for _, g in attempt.nodes)  # whole replicas per node


# -- (f): fractional GPUs ------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_half_gpus_share_one_device(tiny_cluster: Cluster, policy: str) -> None:
    """n02 is b1's, n01 has one GPU left beside a1: two half-GPU jobs start there together
    on the same device; a third waits for one of them (team-a is at its quota of 4 and
    team-b lends nothing), taking h1's half at t=11."""
    work = [
        job("b1", 0, 100, queue="team-b", gpus=4),
        job("a1", 0, 50, gpus=3),
        job("h1", 1, 10, gpus=0.5),
        job("h2", 1, 20, gpus=0.5),
        job("h3", 2, 10, gpus=0.5),
    ]
    result, spy = spied(tiny_cluster, work, policy)
    got = spans(result)
    assert got["h1"] == [(1, 11, "succeeded")]
    assert got["h2"] == [(1, 21, "succeeded")]
    assert got["h3"] == [(11, 21, "succeeded")]
    a1_node = spy.admits["a1"].placements[0].node
    placed = {j: spy.admits[j].placements for j in ("h1", "h2")}
    assert {p[0].node for p in placed.values()} == {a1_node}
    assert placed["h1"][0].devices == placed["h2"][0].devices
    assert len(placed["h1"][0].devices) == 1
    assert [r["gpus"] for r in rows(result)["h1"]] == ["0.5"]


# -- (g): max_runtime --------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_max_runtime_stops_a_longer_job_as_failed(tiny_cluster: Cluster, policy: str) -> None:
    """a1 would run 100 s but is stopped at its max_runtime (30): ``failed``. a3 runs
    exactly its max_runtime and succeeds. Under isolation they run one after another."""
    work = [
        job("a1", 0, 100, max_runtime=30),
        job("a2", 0, 10),
        job("a3", 0, 20, max_runtime=20),
        job("b1", 0, 40, queue="team-b"),  # keeps team-b's node busy: nothing to borrow
    ]
    result = run(tiny_cluster, work, policy)
    got = spans(result)
    assert got["a1"] == [(0, 30, "failed")]
    assert got["a2"] == [(30, 40, "succeeded")]
    assert got["a3"] == [(40, 60, "succeeded")]
    outcomes = {j.job_id: (j.outcome, j.end) for j in result.jobs}
    assert outcomes["a1"] == ("failed", 30)
    summary = summarize(result)
    assert (summary["finished"], summary["failed"], summary["unfinished"]) == (4, 1, 0)
    assert summary["jct_avg_s"] == round((30 + 40 + 60 + 40) / 4, 3)
    assert summary["wait_avg_s"] == round((0 + 30 + 40 + 0) / 4, 3)


# -- (h): time scale ---------------------------------------------------------------------


def test_time_scale_halves_submit_times_not_durations(tiny_cluster: Cluster) -> None:
    """Submit times x 0.5: a2 arrives at 20 and waits for a1 (ends 100); b1 arrives at
    50 and starts at once. Durations are not scaled."""
    work = [job("a1", 0, 100), job("a2", 40, 10), job("b1", 100, 10, queue="team-b")]
    result = run(tiny_cluster, work, "fifo-isolated", time_scale=0.5)
    assert spans(result) == {
        "a1": [(0, 100, "succeeded")],
        "a2": [(100, 110, "succeeded")],
        "b1": [(50, 60, "succeeded")],
    }
    assert {j: r[0]["submit_s"] for j, r in rows(result).items()} == {
        "a1": "0",
        "a2": "20",
        "b1": "50",
    }
    summary = summarize(result)
    assert summary["wait_avg_s"] == round((0 + 80 + 0) / 3, 3)
    assert summary["jct_avg_s"] == round((100 + 90 + 10) / 3, 3)
    unscaled = run(tiny_cluster, work, "fifo-isolated")
    assert spans(unscaled)["b1"] == [(100, 110, "succeeded")]


# -- (i): jobs that can never run ----------------------------------------------------------

NEVER = [
    job("huge", 0, 10, gpus=8),  # one replica larger than any node
    job("gang", 0, 10, gpus=4, replicas=2),  # 8 GPUs: more than team-a's own quota
]
AFTER = [job("a1", 1, 10), job("a2", 2, 10), job("b1", 3, 10, queue="team-b", gpus=2)]


@pytest.mark.parametrize("policy", ISOLATED)
def test_jobs_that_can_never_run_stay_unfinished_and_block_nothing_isolated(
    tiny_cluster: Cluster, policy: str
) -> None:
    result, spy = spied(tiny_cluster, NEVER + AFTER, policy)
    got = spans(result)
    assert got["huge"] == [(None, None, "unfinished")]
    assert got["gang"] == [(None, None, "unfinished")]
    assert spy.reasons["huge"].code is ReasonCode.NO_NODE_FITS
    assert spy.reasons["gang"].code is ReasonCode.EXCEEDS_QUEUE_LIMIT
    # The rest runs exactly as if they were not there.
    assert got["a1"] == [(1, 11, "succeeded")]
    assert got["a2"] == [(11, 21, "succeeded")]
    assert got["b1"] == [(3, 13, "succeeded")]
    without = spans(run(tiny_cluster, AFTER, policy))
    assert {j: got[j] for j in without} == without
    assert rows(result)["huge"] == [
        {
            "job_id": "huge",
            "queue": "team-a",
            "submit_s": "0",
            "start_s": "",
            "end_s": "",
            "gpus": "8",
            "nodes": "",
            "outcome": "unfinished",
        }
    ]
    summary = summarize(result)
    assert (summary["jobs"], summary["finished"], summary["unfinished"]) == (5, 3, 2)
    assert summary["jct_avg_s"] == round((10 + 19 + 10) / 3, 3)
    assert summary["makespan_s"] == 21


@pytest.mark.parametrize("policy", BORROWING)
def test_jobs_that_can_never_run_stay_unfinished_and_block_nothing_borrowing(
    tiny_cluster: Cluster, policy: str
) -> None:
    """With borrowing the 8-GPU gang fits (team-b is idle): it runs 0-10, then a1 and a2
    (a2 borrowing). The 8-GPU single replica still fits no node."""
    after = [job("a1", 1, 10), job("a2", 2, 10)]
    result, spy = spied(tiny_cluster, NEVER + after, policy)
    assert spans(result) == {
        "huge": [(None, None, "unfinished")],
        "gang": [(0, 10, "succeeded")],
        "a1": [(10, 20, "succeeded")],
        "a2": [(10, 20, "succeeded")],
    }
    assert spy.reasons["huge"].code is ReasonCode.NO_NODE_FITS
    summary = summarize(result)
    assert (summary["finished"], summary["unfinished"]) == (3, 1)


@pytest.mark.parametrize("policy", BORROWING)
def test_a_borrowing_gang_is_reclaimed_whole_and_restarts_whole(
    tiny_cluster: Cluster, policy: str
) -> None:
    """The 2 x 4 GPU gang borrows team-b's node at t=0. b1 (team-b) arrives at 3: the
    whole gang stops (both replicas) and b1 starts. The gang, back to pending with submit
    time 0, heads team-a's queue; it needs to borrow 4 GPUs while b1 leaves team-b only 2
    to lend, so it is short of quota. A head short of quota does not idle its queue's
    share (best effort): a1, behind it, fits team-a's own quota and runs 3-13. b1 and a1
    end at 13: the gang restarts whole and runs its full 10 s; a2 follows at 23."""
    result = run(tiny_cluster, NEVER + AFTER, policy)
    assert spans(result) == {
        "huge": [(None, None, "unfinished")],
        "gang": [(0, 3, "preempted"), (13, 23, "succeeded")],
        "b1": [(3, 13, "succeeded")],
        "a1": [(3, 13, "succeeded")],
        "a2": [(23, 33, "succeeded")],
    }
    for attempt in (a for a in result.attempts if a.job_id == "gang"):
        assert attempt.gpus == 8000
        assert sorted(g for _, g in attempt.nodes) == [4000, 4000]
    assert result.preemptions == 1


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_many_jobs_that_can_never_run_do_not_hold_up_their_queue(
    tiny_cluster: Cluster, policy: str
) -> None:
    """A gated job does not hold up its queue (scheduler/gates.py), however many there
    are: a1 starts at its submit time behind 17 jobs larger than any node."""
    work = [job(f"huge{i}", 0, 10, gpus=8) for i in range(17)] + [job("a1", 1, 10)]
    got = spans(run(tiny_cluster, work, policy))
    assert got["a1"] == [(1, 11, "succeeded")]


def test_sixteen_jobs_that_can_never_run_do_not_hold_up_their_queue(
    tiny_cluster: Cluster,
) -> None:
    """The same with 16 (the default backfill_depth): a1 is looked at and starts."""
    work = [job(f"huge{i}", 0, 10, gpus=8) for i in range(16)] + [job("a1", 1, 10)]
    for policy in sorted(PRESETS):
        assert spans(run(tiny_cluster, work, policy))["a1"] == [(1, 11, "succeeded")], policy


@pytest.mark.parametrize("policy", BORROWING)
def test_many_heads_short_of_quota_do_not_hold_up_a_job_that_fits(
    tiny_cluster: Cluster, policy: str
) -> None:
    """Twenty 4-GPU jobs of team-a wait for quota (team-a holds 2 of its 4 GPUs, team-b
    its own node, so there is nothing to borrow): more than the 16 jobs a line looks at
    past a block, yet a1 (1 GPU, within team-a's guarantee, room on n1) starts at its
    submit time. A job short of quota is answered from the quota alone: it is not a
    block that bounds how far the line is looked at (BestEffortFIFO)."""
    work = [job("r", 0, 100, gpus=2), job("b", 0, 100, queue="team-b")]
    work += [job(f"big{i}", 0.5, 10) for i in range(20)] + [job("a1", 1, 10, gpus=1)]
    got = spans(run(tiny_cluster, work, policy))
    assert got["a1"] == [(1, 11, "succeeded")]
    assert got["r"] == [(0, 100, "succeeded")]


FOUR_NODES = """
pools:
  - {name: a100}
nodes:
  - {name_prefix: n, count: 4, pool: a100, capacity: {gpu: 4}}
queues:
  - {name: team-a, quota: {a100: {gpu: 16}}}
"""
"""Four 4-GPU nodes and one queue guaranteed all sixteen GPUs."""


@pytest.mark.parametrize("policy", BORROWING)
def test_many_gangs_short_of_capacity_do_not_hold_up_a_job_that_fits(policy: str) -> None:
    """r1-r3 (3 GPUs each) leave one GPU free on n1-n3 and n4 whole; twenty gangs of
    2 x 3 GPUs (within the quota) need two nodes with 3 GPUs free and wait for capacity:
    more than the 16 jobs a line looks at past a block, yet a1 (1 GPU) starts at its
    submit time. A gang short of capacity does not bound how far its line is looked at
    (a reservation, once it has one, keeps the jobs behind it off its nodes)."""
    cluster = load_cluster_text(FOUR_NODES, source="four")
    work = [job(f"r{i}", 0, 100, gpus=3) for i in (1, 2, 3)]
    work += [job(f"g{i}", 0.5, 10, gpus=3, replicas=2) for i in range(20)]
    work.append(job("a1", 1, 10, gpus=1))
    got = spans(run(cluster, work, policy))
    assert got["a1"] == [(1, 11, "succeeded")]
    assert got["g0"] == [(100, 110, "succeeded")]


@pytest.mark.parametrize("policy", BORROWING)
def test_a_job_larger_than_the_pool_does_not_hold_up_its_queue(
    tiny_cluster: Cluster, policy: str
) -> None:
    """3 x 4 GPUs can never fit the 8-GPU pool, borrowing or not: it stays unfinished
    and a1 (team-a's own node) and a2 (borrowing team-b's idle node) start at once."""
    work = [job("big", 0, 10, gpus=4, replicas=3), job("a1", 1, 10), job("a2", 2, 10)]
    assert spans(run(tiny_cluster, work, policy)) == {
        "big": [(None, None, "unfinished")],
        "a1": [(1, 11, "succeeded")],
        "a2": [(2, 12, "succeeded")],
    }


THREE_NODES = """
pools:
  - {name: a100}
nodes:
  - {name_prefix: n, count: 3, pool: a100, capacity: {gpu: 4}}
queues:
  - {name: team-a, quota: {a100: {gpu: 12}}}
"""


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_a_gang_that_can_never_be_placed_does_not_hold_up_its_queue(policy: str) -> None:
    work = [job("big", 0, 10, gpus=3, replicas=4), job("a1", 1, 10), job("a2", 2, 10)]
    got = spans(run(load_cluster_text(THREE_NODES), work, policy))
    assert got == {
        "big": [(None, None, "unfinished")],
        "a1": [(1, 11, "succeeded")],
        "a2": [(2, 12, "succeeded")],
    }


BORROWER = """
pools:
  - {name: a100}
nodes:
  - {name_prefix: n, count: 2, pool: a100, capacity: {gpu: 4}}
queues:
  - name: org
    children:
      - {name: team-a, quota: {a100: {gpu: 4}}}
      - {name: team-b}
"""
"""team-a is guaranteed one node; team-b has no guarantee and runs on what it borrows."""


@pytest.mark.parametrize("policy", BORROWING)
def test_a_reclaiming_job_starts_right_after_its_one_preemption(policy: str) -> None:
    """b1 borrows the whole pool; team-a's head can never run (8 GPUs on one node). a1
    asks for 2 GPUs of team-a's guarantee at t=10: b1 is preempted once and a1 is
    admitted by a following cycle (replay.py); the gang restarts whole when a1 ends at
    20 and runs its full 100 s."""
    work = [
        job("b1", 0, 100, queue="team-b", replicas=2),
        job("huge", 1, 10, gpus=8),
        job("a1", 10, 10, gpus=2),
    ]
    result = run(load_cluster_text(BORROWER), work, policy)
    assert all(a.end != a.start for a in result.attempts if a.outcome == "preempted")
    assert result.preemptions == 1
    assert spans(result) == {
        "b1": [(0, 10, "preempted"), (20, 120, "succeeded")],
        "huge": [(None, None, "unfinished")],
        "a1": [(10, 20, "succeeded")],
    }


LENDER = """
pools:
  - {name: a100}
nodes:
  - {name: n01, pool: a100, capacity: {gpu: 8}}
queues:
  - name: org
    children:
      - {name: team-a, quota: {a100: {gpu: 6}}}
      - {name: team-b}
      - {name: team-c, quota: {a100: {gpu: 2}}}
"""
"""One 8-GPU node; team-b has no guarantee, team-c lends its 2 GPUs when idle."""


def test_a_reclaim_ping_pong_does_not_leave_fitting_jobs_unfinished() -> None:
    """z and z2 hold the node until t=100 within their quotas, so everything else waits
    for it. Each job then fits the empty node on its own, and the replay runs until no
    event is left: every job must finish. Reclaiming b1 and b2 once each is all it
    takes, since a preemptor is admitted by a following cycle (replay.py)."""
    work = [
        job("z", 0, 100, queue="team-c", gpus=2),
        job("z2", 0, 100, gpus=6),
        job("b1", 1, 10, queue="team-b", gpus=3),
        job("b2", 2, 10, queue="team-b", gpus=4),
        job("b3", 3, 10, queue="team-b", gpus=8),
        job("a1", 4, 10, gpus=8),
        job("a2", 5, 10, gpus=1, replicas=3),
        job("a3", 6, 10, gpus=4),
    ]
    result = run(load_cluster_text(LENDER), work, "borrowing")
    assert {j.job_id: j.outcome for j in result.jobs} == dict.fromkeys(
        [w.job_id for w in work], "succeeded"
    )
    assert result.preemptions <= 2
