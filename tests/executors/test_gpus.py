"""GPU discovery: NVML when it answers, the node's declared devices otherwise."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from allotment.domain.cluster import Node
from allotment.executors.base import GpuInfo
from allotment.executors.gpus import discover_gpus
from allotment.executors.local import LocalExecutor


class NVMLError(Exception):
    pass


def fake_nvml(*, fail_at: str | None = None) -> types.ModuleType:
    module: Any = types.ModuleType("pynvml")
    calls: list[str] = []

    def call(name: str, value: object) -> Any:
        def f(*_args: object) -> object:
            calls.append(name)
            if name == fail_at:
                raise NVMLError(name)
            return value

        return f

    module.NVMLError = NVMLError
    module.calls = calls
    module.nvmlInit = call("init", None)
    module.nvmlShutdown = call("shutdown", None)
    module.nvmlDeviceGetCount = call("count", 2)
    module.nvmlDeviceGetHandleByIndex = call("handle", object())
    module.nvmlDeviceGetUUID = call("uuid", b"GPU-1234")
    module.nvmlDeviceGetName = call("name", "NVIDIA H100")
    module.nvmlDeviceGetMemoryInfo = call("memory", types.SimpleNamespace(total=80 * 2**30))
    return module


NODE = Node.model_validate(
    {"name": "n1", "pool": "a100", "capacity": {"gpu": 2, "cpu": 8, "memory": "64Gi"}}
)
NODE_WITH_DEVICES = Node.model_validate(
    {
        "name": "n2",
        "pool": "a100",
        "capacity": {"gpu": 1},
        "devices": [
            {"index": 3, "uuid": "GPU-x", "model": "A100", "memory": {"gpu_memory": "40Gi"}}
        ],
    }
)


def test_nvml_devices_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus = discover_gpus(NODE)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0] == GpuInfo(
        index=0, uuid="GPU-1234", model="NVIDIA H100", memory_bytes=80 * 2**30, source="nvml"
    )
    assert nvml.calls[-1] == "shutdown"


@pytest.mark.parametrize("fail_at", ["init", "count", "uuid", "memory"])
def test_any_nvml_failure_falls_back_to_the_declared_node(
    monkeypatch: pytest.MonkeyPatch, fail_at: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail_at=fail_at))
    assert discover_gpus(NODE) == [GpuInfo(index=0), GpuInfo(index=1)]


def test_missing_pynvml_falls_back_to_declared_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    assert discover_gpus(NODE_WITH_DEVICES) == [
        GpuInfo(index=3, uuid="GPU-x", model="A100", memory_bytes=40 * 2**30)
    ]
    assert discover_gpus(None) == []


def test_local_executor_inventory_uses_discovery(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert len(LocalExecutor(tmp_path, node=NODE).inventory()) == 2
