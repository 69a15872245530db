"""GPU sources: NVML through a stand-in ``pynvml`` module (this machine may have no
driver), its clean degradation, the fake file, and the per-instant aggregation."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allotment.telemetry.aggregate import Holding, fold, interval_start, job_samples
from allotment.telemetry.sources import (
    DeviceReading,
    FakeSource,
    NoSource,
    NvmlSource,
    make_source,
    parse_fake_readings,
)


def fake_nvml(*, init_fails: bool = False, processes_fail: bool = False) -> ModuleType:
    module = ModuleType("pynvml")
    state: dict[str, Any] = {"shutdown": 0}

    def init() -> None:
        if init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def processes(handle: int) -> list[Any]:
        if processes_fail:
            raise RuntimeError("Not Supported")
        return [SimpleNamespace(pid=100 + handle)]

    def shutdown() -> None:
        state["shutdown"] += 1

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=10 * (h + 1))  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=h * 1000, total=10**9)  # type: ignore[attr-defined]
    module.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[attr-defined]
    module.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []  # type: ignore[attr-defined]
    module.state = state  # type: ignore[attr-defined]
    return module


def test_nvml_readings_with_their_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    source = NvmlSource("box")
    assert source.available
    assert source.read() == [
        DeviceReading(node="box", device=0, utilization=10.0, memory_used=0, pids=(100,)),
        DeviceReading(node="box", device=1, utilization=20.0, memory_used=1000, pids=(101,)),
    ]
    source.close()
    assert module.state["shutdown"] == 1  # type: ignore[attr-defined]
    assert source.read() == []


def test_nvml_without_process_lists_says_it_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(processes_fail=True))
    assert [r.pids for r in NvmlSource("box").read()] == [None, None]


def test_without_a_driver_nvml_gives_nothing_and_the_default_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_fails=True))
    source = NvmlSource("box")
    assert not source.available and source.read() == []
    assert isinstance(make_source(None, node="box", file=None), NoSource)
    assert isinstance(make_source("nvml", node="box", file=None), NvmlSource)  # as asked


def test_a_relative_fake_file_is_taken_from_the_cluster_files_folder(tmp_path: Path) -> None:
    source = make_source("fake", node="box", file="gpus.yaml", base=tmp_path)
    assert isinstance(source, FakeSource) and source.path == tmp_path / "gpus.yaml"
    (tmp_path / "gpus.yaml").write_text("box/1: {utilization: 42, memory: 1Gi}\n")
    [reading] = source.read()
    assert (reading.device, reading.utilization, reading.memory_used) == (1, 42.0, 2**30)


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"box": {}},
        {"box/x": {}},
        {"box/0": 5},
        {"box/0": {"util": 1}},
        {"box/0": {"utilization": 101}},
    ],
)
def test_malformed_fake_readings_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_fake_readings(bad)


def test_a_jobs_sample_is_the_mean_of_its_devices_and_the_sum_of_its_replicas() -> None:
    readings = [
        DeviceReading(node="a", device=0, utilization=10, memory_used=5),
        DeviceReading(node="a", device=1, utilization=30, memory_used=7),
        DeviceReading(node="b", device=0, utilization=None, memory_used=None),
    ]
    held = Holding(
        job_id="j",
        attempt=2,
        devices=(("a", 0), ("a", 1), ("b", 0), ("c", 3)),
        replicas=[(1.5, 100), (None, 50)],
    )
    [sample] = job_samples([held], readings)
    assert (sample.gpus, sample.gpu_util, sample.gpu_memory) == (4, 20.0, 12)
    assert (sample.cpu, sample.memory) == (1.5, 150)
    [cpu_only] = job_samples([Holding(job_id="k", attempt=1, devices=())], readings)
    assert cpu_only.gpu_util is None and cpu_only.gpus == 0


@given(st.lists(st.floats(0, 100), min_size=1, max_size=50))
def test_folding_gives_the_mean_and_the_maximum(values: list[float]) -> None:
    agg = None
    for value in values:
        agg = fold(agg, util=value)
    assert agg is not None and agg.samples == len(values)
    assert agg.util_avg == pytest.approx(sum(values) / len(values))
    assert agg.util_max == max(values)


@given(st.floats(0, 1e10), st.sampled_from([0.5, 1.0, 60.0]))
def test_an_instant_lies_in_its_interval(at: float, length: float) -> None:
    start = interval_start(at, length)
    assert start <= at < start + length


def test_a_job_with_one_busy_gpu_of_two_is_not_idle_at_its_peak() -> None:
    """Reclamation reads ``util_max``: the busiest device in any sample, so a job that
    keeps one of its GPUs busy is never judged idle by the average of its GPUs."""
    readings = [
        DeviceReading(node="box", device=0, utilization=0.0, memory_used=None),
        DeviceReading(node="box", device=1, utilization=100.0, memory_used=None),
    ]
    [sample] = job_samples(
        [Holding(job_id="j", attempt=1, devices=(("box", 0), ("box", 1)))], readings
    )
    assert (sample.gpu_util, sample.gpu_util_peak) == (50.0, 100.0)
    folded = fold(None, util=sample.gpu_util, util_peak=sample.gpu_util_peak)
    assert (folded.util_avg, folded.util_max) == (50.0, 100.0)
