"""GPU discovery: NVML when a driver answers, the node's declared devices otherwise."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from allotment.domain.cluster import Node
from allotment.domain.resources import GPU_MEMORY, MEMORY, MILLI
from allotment.executors.base import GpuInfo


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus() -> list[GpuInfo] | None:
    """The GPUs NVML reports, or ``None`` when ``pynvml`` or the driver is unavailable.

    Any failure of the library (missing module, missing driver, an NVML error mid-way)
    counts as unavailable: discovery must never take the executor down.
    """
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # every NVML failure means "no NVML here"
        return None
    try:
        found = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            found.append(
                GpuInfo(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    source="nvml",
                )
            )
        return found
    except Exception:  # same reasoning as above
        return None
    finally:
        # Shutting down a half-initialised library may fail too.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def declared_gpus(node: Node | None) -> list[GpuInfo]:
    """The GPUs ``node`` declares: its ``devices`` list, else indexes ``0..gpu-1``."""
    if node is None:
        return []
    if node.devices:
        out = []
        for device in node.devices:
            memory = None
            if device.memory is not None:
                milli = device.memory[GPU_MEMORY] or device.memory[MEMORY]
                memory = milli // MILLI if milli else None
            out.append(
                GpuInfo(
                    index=device.index, uuid=device.uuid, model=device.model, memory_bytes=memory
                )
            )
        return out
    return [GpuInfo(index=i) for i in range(node.gpu_count)]


def discover_gpus(node: Node | None = None) -> list[GpuInfo]:
    """NVML's view of this machine's GPUs when available, else ``declared_gpus(node)``."""
    found = nvml_gpus()
    return found if found is not None else declared_gpus(node)
