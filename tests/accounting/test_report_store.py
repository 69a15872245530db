"""The report on a store filled by hand, with answers computed by hand, on SQLite and
PostgreSQL (skipped when PostgreSQL cannot be reached)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.accounting.figures import Window, from_micro
from allotment.accounting.report import Report, build_report
from tests.accounting import rows
from tests.store.conftest import engine, sessions  # noqa: F401  (parametrized fixtures)

T0 = 1_800_000_000.0
DAY = 86400.0
WINDOW = Window(since=T0, until=T0 + DAY)
PRICES = {"a100": 2.5, "cpu": 0.0}


def price_of(pool: str) -> float:
    return PRICES.get(pool, 0.0)


def fill(session: Session) -> None:
    """Hand-computed (window T0..T0+1d, a100 at 2.5 per GPU-hour):

    - j-a (vision, vt, alice, training): 2 GPUs, 8 CPUs, 16 GiB from T0-1h to T0+2h:
      2h in the window = 4 GPU-h, 16 core-h, 32 GiB-h, cost 10. Samples: T0..T0+1h at 50%
      (measured 2, used 1, idle 1), T0+1h..T0+2h unmeasured (2), T0-1h at 100% (outside).
      Preempted at T0+2h (cause reclaim); admitted before the window (no wait counted):
      its 4 GPU-h in the window are interrupted.
    - j-b (nlp, nq, nick, notebook): 1 GPU from T0+23h, still running: 1 GPU-h, cost 2.5;
      sample T0+23h..+30m at 20% (measured 0.5, used 0.1, idle 0.4, unmeasured 0.5).
      Waited 800 s (pending T0+82000, admitted T0+82800).
    - j-c (vision, vt, bob, batch, experiment): 1 GPU T0+1h..T0+1.5h, failed (oom):
      0.5 GPU-h, cost 1.25, all unmeasured. Waited 600 s.
    - j-d (vision, vt): pending since T0+80000, still waiting: age 6400 s.
    - j-e (nlp, nq): reclaimed at T0+10h with reason idle; 0 GPUs, 1 CPU for 1h on pool cpu
      (interrupted, but 0 GPU-h).
    - j-f (vision): ended before the window: not in the report.
    """
    rows.job(session, "j-a", tenant="vision", queue="vt", user="alice", type="training")
    rows.attempt(
        session,
        "j-a",
        1,
        pool="a100",
        start=T0 - 3600,
        end=T0 + 7200,
        gpus=2,
        cpu=8,
        memory_gib=16,
        state="preempted",
        failure_class="preempted",
    )
    rows.usage(session, "j-a", 1, start=T0 - 3600, length=3600, util=100)
    rows.usage(session, "j-a", 1, start=T0, length=3600, util=50)
    rows.usage(session, "j-a", 1, start=T0 + 3600, length=3600, util=None)
    rows.event(session, "j-a", T0 - 7200, "pending")
    rows.event(session, "j-a", T0 - 3600, "admitted")
    rows.event(session, "j-a", T0 + 7200, "preempted", detail={"cause": "reclaim"})

    rows.job(session, "j-b", tenant="nlp", queue="nq", user="nick", type="notebook")
    rows.attempt(session, "j-b", 1, pool="a100", start=T0 + 82800, end=None, gpus=1)
    rows.usage(session, "j-b", 1, start=T0 + 82800, length=1800, util=20)
    rows.event(session, "j-b", T0 + 82000, "pending")
    rows.event(session, "j-b", T0 + 82800, "admitted")

    rows.job(
        session,
        "j-c",
        tenant="vision",
        queue="vt",
        user="bob",
        type="batch",
        priority_class="experiment",
        state="failed",
    )
    rows.attempt(
        session,
        "j-c",
        1,
        pool="a100",
        start=T0 + 3600,
        end=T0 + 5400,
        gpus=1,
        state="failed",
        failure_class="oom",
    )
    rows.event(session, "j-c", T0 + 3000, "pending")
    rows.event(session, "j-c", T0 + 3600, "admitted")
    rows.event(session, "j-c", T0 + 5400, "failed", detail={"failure_class": "oom"})

    rows.job(session, "j-d", tenant="vision", queue="vt", state="pending", submit_time=T0 + 80000)
    rows.event(session, "j-d", T0 + 80000, "pending")

    rows.job(session, "j-e", tenant="nlp", queue="nq", user="nick", type="data", state="reclaimed")
    rows.attempt(
        session,
        "j-e",
        1,
        pool="cpu",
        start=T0 + 32400,
        end=T0 + 36000,
        gpus=0,
        cpu=1,
        state="reclaimed",
        failure_class="reclaimed",
    )
    rows.event(session, "j-e", T0 + 36000, "reclaimed", message="idle", detail={"reason": "idle"})

    rows.job(session, "j-f", tenant="vision", queue="vt", state="succeeded")
    rows.attempt(session, "j-f", 1, pool="a100", start=T0 - 9000, end=T0 - 10, gpus=4)


FIGURES = ("allocated", "used", "idle", "unmeasured", "cpu", "memory", "cost", "interrupted")


def report(sessions: sessionmaker[Session], by: str, tenant: str | None = None) -> Report:  # noqa: F811
    with sessions.begin() as session:
        fill(session)
    with sessions() as session:
        return build_report(session, WINDOW, by=by, tenant=tenant, price_of=price_of)


def figures(group: object) -> dict[str, float]:
    f = group.figures  # type: ignore[attr-defined]
    return {name: from_micro(getattr(f, name)) for name in FIGURES}


def test_hand_computed_figures_per_tenant(sessions: sessionmaker[Session]) -> None:  # noqa: F811
    got = report(sessions, "tenant")
    assert [g.key for g in got.rows] == ["nlp", "vision"]
    nlp, vision = got.rows
    assert figures(vision) == {
        "allocated": 4.5,
        "used": 1.0,
        "idle": 1.0,
        "unmeasured": 2.5,
        "cpu": 16.0,
        "memory": 32.0,
        "cost": 11.25,
        "interrupted": 4.0,
    }
    assert figures(nlp) == {
        "allocated": 1.0,
        "used": 0.1,
        "idle": 0.4,
        "unmeasured": 0.5,
        "cpu": 1.0,
        "memory": 0.0,
        "cost": 2.5,
        "interrupted": 0.0,
    }
    assert (len(vision.jobs), vision.attempts, len(nlp.jobs), nlp.attempts) == (2, 2, 2, 2)
    assert figures(got.total)["cost"] == 13.75
    [open_record] = [r for r in got.records if r.input.job == "j-b"]
    assert open_record.open and open_record.held_until == T0 + DAY


def test_waits_failures_and_interruptions(sessions: sessionmaker[Session]) -> None:  # noqa: F811
    got = report(sessions, "queue")
    assert [g.key for g in got.rows] == ["nq", "vt"]
    by_queue = {(w.queue, w.priority_class): w for w in got.waits}
    nq = by_queue[("nq", "training")]
    assert (nq.count, nq.mean_s, nq.p50_s, nq.p95_s, nq.max_s) == (1, 800, 800, 800, 800)
    vt = by_queue[("vt", "training")]
    assert (vt.count, vt.waiting, vt.waiting_max_s) == (0, 1, 6400)
    assert by_queue[("vt", "experiment")].max_s == 600
    whole = got.waits_total
    assert (whole.count, whole.mean_s, whole.p50_s, whole.p95_s, whole.max_s) == (
        2,
        700,
        600,
        800,
        800,
    )
    assert {label: n for label, _, n in got.wait_histogram if n} == {"5m-15m": 2}
    assert got.failures == [(("oom", "a100", "vt", "batch"), 1)]
    assert got.interruptions == [
        (("preempted", "reclaim", "vt"), 1),
        (("reclaimed", "idle", "nq"), 1),
    ]


def test_a_tenant_sees_only_its_jobs(sessions: sessionmaker[Session]) -> None:  # noqa: F811
    got = report(sessions, "user", tenant="nlp")
    assert {r.input.tenant for r in got.records} == {"nlp"}
    assert [g.key for g in got.rows] == ["nick"]
    assert [(w.queue, w.count) for w in got.waits] == [("nq", 1)]
    assert got.failures == [] and [k for (k, _, _), _ in got.interruptions] == ["reclaimed"]


@pytest.mark.parametrize("by", ["tenant", "queue", "pool", "user", "type"])
def test_totals_are_the_sums_of_the_records(
    sessions: sessionmaker[Session],  # noqa: F811
    by: str,
) -> None:
    got = report(sessions, by)
    for name in FIGURES:
        records = sum(Decimal(repr(figures(r)[name])) for r in got.records)
        groups = sum(Decimal(repr(figures(g)[name])) for g in got.rows)
        assert records == groups == Decimal(repr(figures(got.total)[name])), name


def test_timeline_averages(sessions: sessionmaker[Session]) -> None:  # noqa: F811
    got = report(sessions, "tenant")
    first = got.timeline[0]  # T0 .. T0+15m: j-a's 2 GPUs, measured, at 50%
    assert (first.allocated, first.measured, first.used) == (2.0, 2.0, 1.0)
    last = got.timeline[-1]  # the last 15 min: j-b's 1 GPU, unmeasured
    assert (last.allocated, last.measured, last.used) == (1.0, 0.0, 0.0)
