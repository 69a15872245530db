"""Idle and TTL reclamation decisions, without threads or a store: rows in, decisions
out (:func:`allotment.upkeep.reaping.decide`), and the ``cluster.yaml`` shape."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.domain.errors import ConfigError
from allotment.domain.job import JobType
from allotment.domain.loading import load_cluster_text
from allotment.domain.upkeep import JOB_TYPES, IdlePolicy, ReapingPolicy, TypePolicy
from allotment.upkeep.reaping import Decision, RunningAttempt, UsageRow, decide, idle_run

POLICY = ReapingPolicy(
    idle=IdlePolicy(threshold=5, window=60, warn_before=20, exempt=["training"]),
    types={"notebook": TypePolicy(idle_window=30, ttl=600), "service": TypePolicy(idle_window=120)},
)


def job(type: str = "notebook", *, started: float = 0.0, gpus: int = 1) -> RunningAttempt:
    return RunningAttempt(job_id="j-1", attempt=1, queue="q", type=type, started=started, gpus=gpus)


def rows(
    utils: Sequence[float | None], *, start: float = 0.0, length: float = 1.0
) -> list[UsageRow]:
    return [
        UsageRow(start=start + i * length, length=length, samples=1, util_avg=u, util_max=u)
        for i, u in enumerate(utils)
    ]


def run(
    now: float,
    usage: list[UsageRow],
    *,
    attempt: RunningAttempt | None = None,
    warned: Sequence[float] = (),
    policy: ReapingPolicy | None = POLICY,
) -> list[Decision]:
    attempt = attempt or job()
    return decide(
        now,
        [attempt],
        lambda _attempt: policy,
        {(attempt.job_id, attempt.attempt): usage},
        {(attempt.job_id, attempt.attempt): list(warned)} if warned else {},
    )


def test_job_types_match_the_job_spec() -> None:
    assert set(JOB_TYPES) == {t.value for t in JobType}


def test_an_idle_notebook_is_warned_then_reclaimed_after_the_notice() -> None:
    idle = rows([1.0] * 40)  # 40 one-second intervals below 5 %
    # Idle for 39 s (the first interval is not counted): past 30 - 20, so a warning.
    [warn] = run(40.0, idle)
    assert (warn.action, warn.reason) == ("warn", "idle")
    assert warn.evidence["samples"] and warn.evidence["idle_s"] == pytest.approx(39.0)
    # Warned at 40: idle past its 30 s window, but the 20 s notice runs until 60.
    assert run(45.0, rows([1.0] * 45), warned=[40.0]) == []
    [reaped] = run(60.0, rows([1.0] * 60), warned=[40.0])
    assert (reaped.action, reaped.reason) == ("reap", "idle")
    assert reaped.evidence["warned_at"] == 40.0


def test_a_warning_given_at_the_very_start_of_an_idle_run_counts() -> None:
    # A notebook's own idle_timeout alone warns as soon as it is idle (warn_before is
    # the whole window): that warning, given while the first idle interval was still
    # open, must count, or the notebook is warned again every turn and never reclaimed.
    alone = ReapingPolicy().with_own("notebook", ttl=None, idle_timeout=8)
    usage = rows([0.0], start=100.0, length=0.5)
    [warn] = run(100.2, usage, policy=alone)
    assert warn.action == "warn"
    usage = rows([0.0] * 20, start=100.0, length=0.5)
    [reap] = run(109.0, usage, policy=alone, warned=[100.2])
    assert reap.action == "reap"


def test_a_notebook_is_idle_only_since_its_last_kernel_activity() -> None:
    active = RunningAttempt(
        job_id="j-1", attempt=1, queue="q", type="notebook", started=0.0, gpus=1, active_at=25.0
    )
    # Notebooks: window 30 s, warned 20 s before. Without the activity this one would
    # be warned at 10 s and reclaimed at 30 s; it ran a cell at 25 s.
    assert run(32.0, rows([1.0] * 32), attempt=active) == []  # idle 7 s since then
    [warn] = run(36.0, rows([1.0] * 36), attempt=active)
    assert warn.action == "warn" and "no notebook activity" in warn.message
    assert warn.evidence["idle_since"] == 25.0 and warn.evidence["notebook_active_at"] == 25.0
    assert run(55.0, rows([1.0] * 55), attempt=active, warned=[36.0]) == []  # the notice
    [reap] = run(56.0, rows([1.0] * 56), attempt=active, warned=[36.0])
    assert reap.action == "reap"
    # A warning given before the notebook was used again does not count.
    assert run(60.0, rows([1.0] * 60), attempt=active, warned=[20.0])[0].action == "warn"


def test_a_busy_sample_ends_the_idle_run_and_its_warning() -> None:
    usage = rows([1.0] * 30 + [50.0] + [1.0] * 5)
    assert run(36.0, usage, warned=[20.0]) == []  # idle 5 s since the busy one


def test_a_gap_in_the_samples_ends_the_evidence() -> None:
    usage = rows([1.0] * 20) + rows([1.0] * 5, start=30.0)
    found = idle_run(usage, 5.0, now=35.0, started=0.0)
    assert found is not None and found[0] == 31.0


def test_stale_samples_decide_nothing() -> None:
    assert run(200.0, rows([0.0] * 100)) == []


def test_exempt_types_and_jobs_without_gpus_are_never_reclaimed_for_idleness() -> None:
    assert run(500.0, rows([0.0] * 500), attempt=job("training"), warned=[1.0]) == []
    assert run(500.0, rows([0.0] * 500), attempt=job("batch", gpus=0), warned=[1.0]) == []


def test_types_use_their_own_window() -> None:
    usage = rows([0.0] * 100)
    assert run(100.0, usage, attempt=job("service")) == []  # 120 s window: 100-20 reached
    usage = rows([0.0] * 110)
    [warn] = run(110.0, usage, attempt=job("service"))
    assert warn.action == "warn"


def test_without_an_idle_section_only_types_with_an_idle_window_are_watched() -> None:
    policy = ReapingPolicy(types={"notebook": TypePolicy(idle_window=10)})
    assert run(50.0, rows([0.0] * 50), attempt=job("batch"), policy=policy) == []
    assert [d.action for d in run(50.0, rows([0.0] * 50), policy=policy)] == ["warn"]


def test_ttl_reclaims_a_notebook_that_ran_too_long_busy_or_not() -> None:
    [d] = run(700.0, rows([90.0] * 10, start=690.0), attempt=job(started=50.0))
    assert (d.action, d.reason) == ("reap", "ttl")
    assert d.evidence["ttl_s"] == 600
    assert run(500.0, rows([90.0] * 10, start=490.0), attempt=job(started=50.0)) == []


def test_no_policy_no_decision() -> None:
    assert run(1000.0, rows([0.0] * 1000), policy=None, warned=[1.0]) == []


@settings(max_examples=300, deadline=None)
@given(
    utils=st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=0, max_size=80),
    length=st.sampled_from([0.5, 1.0, 5.0]),
    started=st.floats(0, 60),
    now_extra=st.floats(0, 10),
    warned=st.lists(st.floats(0, 500), max_size=3),
    type=st.sampled_from(JOB_TYPES),
    threshold=st.floats(0, 100),
    window=st.floats(1, 300),
    warn_before=st.floats(0, 300),
)
def test_never_reclaimed_idle_before_its_window_passed_with_every_sample_below(
    utils: list[float | None],
    length: float,
    started: float,
    now_extra: float,
    warned: list[float],
    type: str,
    threshold: float,
    window: float,
    warn_before: float,
) -> None:
    policy = ReapingPolicy(
        idle=IdlePolicy(
            threshold=threshold, window=window, warn_before=warn_before, exempt=["training"]
        )
    )
    usage = rows(utils, length=length)
    now = len(utils) * length + now_extra
    attempt = job(type, started=started)
    for d in run(now, usage, attempt=attempt, warned=warned, policy=policy):
        assert type != "training"  # exempt types never
        if d.action != "reap":
            continue
        # The evidence: every interval from the start of the idle time to the newest
        # sample was measured and below the threshold, and they span the window.
        since = d.evidence["idle_since"]
        covering = [r for r in usage if r.start + r.length > since]
        assert covering and all(r.util_max is not None and r.util_max < threshold for r in covering)
        assert min(now, usage[-1].start + usage[-1].length) - since >= window
        assert since >= started
        # ... and a warning was given since the idle run's first interval began (its
        # end is ``since``: the first sample showing idleness), at least warn_before ago.
        began = since
        for r in reversed(usage):
            if r.util_max is None or r.util_max >= threshold or r.samples <= 0:
                break
            began = min(began, r.start)
        assert any(w >= began and now - w >= min(warn_before, window) for w in warned)


CLUSTER = """
pools: [{name: p}]
nodes: [{name: n, pool: p, capacity: {gpu: 2}}]
tenants: [{name: t, scratch_expiry: 7d, scratch_grace: 1h}]
telemetry: {source: fake, file: gpus.json, interval: 1s, aggregate: 2s, retention: 1d}
orphans: kill
queues:
  - name: root
    reaping:
      idle: {threshold: 5%, window: 30m, warn_before: 10m, exempt: [training]}
      types:
        notebook: {idle_window: 1h, ttl: 12h}
    children:
      - {name: a, tenant: t}
      - name: b
        tenant: t
        reaping: {types: {service: {idle_window: 4h}}}
"""


def test_the_cluster_file_shape_and_inheritance() -> None:
    cluster = load_cluster_text(CLUSTER)
    a = cluster.queues["a"].reaping
    assert a is not None and a.idle_rule("notebook") == (5.0, 3600.0, 600.0)
    assert a.idle_rule("training") is None and a.ttl("notebook") == 12 * 3600
    b = cluster.queues["b"].reaping  # its own, whole: no idle section, no notebook TTL
    assert b is not None and b.idle_rule("notebook") is None
    assert b.idle_rule("service") == (5.0, 4 * 3600.0, 600.0)
    assert cluster.tenants["t"].scratch_expiry == 7 * 86400
    assert cluster.source.telemetry.source == "fake" and cluster.source.orphans == "kill"


def test_a_notebooks_own_limits_apply_on_top_of_its_queues() -> None:
    queue = load_cluster_text(CLUSTER).queues["a"].reaping
    assert queue is not None  # notebooks: idle window 1h, ttl 12h; training exempt
    tighter = queue.with_own("notebook", ttl=3600, idle_timeout=600)
    assert tighter.ttl("notebook") == 3600 and tighter.idle_rule("notebook") == (5.0, 600, 600)
    looser = queue.with_own("notebook", ttl=86400, idle_timeout=7200)
    assert looser.ttl("notebook") == 12 * 3600  # the queue's limits still hold
    assert looser.idle_rule("notebook") == (5.0, 3600.0, 600.0)
    alone = ReapingPolicy().with_own("notebook", ttl=None, idle_timeout=120)
    assert alone.ttl("notebook") is None and alone.idle_rule("notebook") == (5.0, 120, 120)
    exempt = ReapingPolicy(idle=IdlePolicy(exempt=["notebook"]))
    assert exempt.idle_rule("notebook") is None
    assert exempt.with_own("notebook", ttl=None, idle_timeout=300).idle_rule("notebook") == (
        5.0,
        300,
        300,
    )
    assert queue.with_own("notebook", ttl=None, idle_timeout=None) is queue
    assert tighter.ttl("service") == queue.ttl("service")  # other types untouched


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("reaping: {idle: {treshold: 5}}", "treshold"),
        ("reaping: {types: {notbook: {ttl: 1h}}}", "notbook"),
        ("reaping: {idle: {threshold: 150%}}", "threshold"),
    ],
)
def test_mistakes_in_a_policy_are_errors_naming_the_key(bad: str, says: str) -> None:
    text = f"pools: [{{name: p}}]\nqueues:\n  - name: q\n    {bad}\n"
    with pytest.raises(ConfigError) as info:
        load_cluster_text(text)
    assert says in str(info.value)


def test_telemetry_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="file"):
        load_cluster_text("telemetry: {source: fake}\n")
    with pytest.raises(ConfigError, match="aggregate"):
        load_cluster_text("telemetry: {interval: 1m, aggregate: 10s}\n")
