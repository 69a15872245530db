"""The compiled scheduling core (``make compiled``): it decides exactly as its sources do,
the tests that patch the core's internals pass on the sources, a source newer than the
compiled modules turns them off, and the core's value types survive pickling (the
what-if's worker processes). Skipped where the core is not compiled (no C compiler),
but for the last; ``make test`` compiles it first."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import allotment.scheduler as core
from allotment.domain.reasons import Reason, ReasonCode
from allotment.scheduler.decisions import Admit, Preempt, Victim
from allotment.scheduler.snapshot import PendingJob, ReplicaPlacement, ReplicaRequest
from allotment.sim.synthetic import GangHeavy, cluster_yaml, gang_heavy, trace_csv

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(core.__file__).resolve().parents[2]

compiled_only = pytest.mark.skipif(
    not core.COMPILED, reason="the scheduling core is not compiled here (make compiled)"
)


def env(pure: bool, pythonpath: Path = SRC) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "ALLOT_PURE_CORE"}
    out["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{ROOT}"
    if pure:
        out["ALLOT_PURE_CORE"] = "1"
    return out


def where_cycle_comes_from(pythonpath: Path, *, pure: bool = False) -> tuple[bool, str]:
    code = (
        "import allotment.scheduler as s, allotment.scheduler.cycle as c;"
        "print(s.COMPILED, c.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env(pure, pythonpath),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0] == "True", out[1]


@compiled_only
def test_the_core_runs_compiled_unless_told_otherwise() -> None:
    compiled, where = where_cycle_comes_from(SRC)
    assert compiled and where.endswith(".so")
    compiled, where = where_cycle_comes_from(SRC, pure=True)
    assert not compiled and where.endswith("cycle.py")


@compiled_only
def test_a_source_newer_than_the_compiled_modules_turns_them_off(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(SRC / "allotment", copy / "allotment")  # modification times kept
    for lib in SRC.glob("*__mypyc*"):
        shutil.copy2(lib, copy / lib.name)
    assert where_cycle_comes_from(copy)[0]
    built = [*(copy / "allotment" / "scheduler").glob("*.so"), *copy.glob("*.so")]
    for edited in ("scheduler/quota.py", "domain/resources.py"):  # its own, what it imports
        (copy / "allotment" / edited).touch()
        compiled, where = where_cycle_comes_from(copy)
        assert not compiled and where == str(copy / "allotment" / "scheduler" / "cycle.py")
        for module in built:
            module.touch()  # built again
        assert where_cycle_comes_from(copy)[0]


@compiled_only
def test_the_tests_that_patch_the_core_pass_on_its_sources() -> None:
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            "-m",
            "patches_core",
            "tests/scheduler",
        ],
        cwd=ROOT,
        env=env(pure=True),
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert " passed" in ran.stdout and "skipped" not in ran.stdout


@compiled_only
def test_compiled_and_sources_decide_alike(tmp_path: Path) -> None:
    workload = gang_heavy(GangHeavy(load=0.95, seed=2, nodes=8, days=1.0))
    (tmp_path / "trace.csv").write_text(trace_csv(workload))
    (tmp_path / "cluster.yaml").write_text(cluster_yaml(workload))
    presets = [
        "fifo-isolated",
        "borrowing",
        "fair-share",
        "backfill",
        "default",
        "fair-share+protect",
        "default+protect",
    ]
    results = {}
    for pure in (False, True):
        out = tmp_path / ("pure" if pure else "compiled")
        out.mkdir()
        args = [sys.executable, "-m", "allotment.cli.main", "sim", str(tmp_path / "trace.csv")]
        args += ["-f", str(tmp_path / "cluster.yaml"), "-o", "json"]
        args += ["--jobs-out", str(out / "jobs.csv")]
        for preset in presets:
            args += ["-p", preset]
        ran = subprocess.run(args, env=env(pure), capture_output=True, text=True, check=True)
        summaries = json.loads(ran.stdout)
        for summary in summaries:
            for timing in ("wall_s", "scheduler_s"):
                summary.pop(timing, None)
        jobs = {p: (out / f"jobs.{p}.csv").read_text() for p in presets}
        results[pure] = (summaries, jobs)
    compiled, pure_ = results[False], results[True]
    assert compiled[0] == pure_[0]
    for preset in presets:
        assert compiled[1][preset] == pure_[1][preset], preset
    assert sum(s["preemptions"] for s in compiled[0]) > 0  # the trace is contended


def test_the_core_value_types_survive_pickling() -> None:
    request = ReplicaRequest(name="worker", count=2, resources={"gpu": 1000})
    placed = ReplicaPlacement(group="worker", index=1, node="n1", resources={"gpu": 1000})
    victim = Victim(job="b", queue="q2", cause="reclaim", message="reclaimed for a")
    reason = Reason(ReasonCode.WAITING_FOR_PREEMPTION, "preempting b", {"victims": ["b"]})
    values: list[object] = [
        request,
        placed,
        PendingJob(id="a", queue="q", priority_class="p", submit_time=1.0, replicas=(request,)),
        victim,
        Admit(job="a", queue="q", pool="p", placements=(placed,), borrowed={"gpu": 1000}),
        Preempt(job="a", queue="q", pool="p", victims=(victim,), reason=reason),
    ]
    for value in values:
        again = pickle.loads(pickle.dumps(value))
        assert again == value and type(again) is type(value)
