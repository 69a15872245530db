"""The submission bench on a few jobs: every submission is stored, and the phases are
timed (behaviour only; no figure is checked)."""

from __future__ import annotations

from bench.bench_kueue import Config
from bench.bench_submit import Phases, run


def test_a_profiled_run_times_the_phases_and_stores_every_job() -> None:
    rate, cpu_ms, phases = run(Config(cohorts=1, client_procs=0), clients=2, jobs=12, profile=True)
    assert rate > 0 and cpu_ms > 0
    for name in ("spec: parse text", "store: job insert", "audit: record insert", "auth"):
        assert phases.get(name, 0.0) > 0.0, name


def test_phases_are_unwrapped_afterwards() -> None:
    import allotment.domain.loading as loading

    before = loading.parse_spec
    phases = Phases()
    phases.wrap(loading, "parse_spec", "x")
    assert loading.parse_spec is not before
    loading.parse_spec('{"a": 1}')
    phases.undo()
    assert loading.parse_spec is before and phases.calls["x"] == 1
