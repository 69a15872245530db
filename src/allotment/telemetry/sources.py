"""Where GPU readings come from: NVML (nvidia-ml-py) when a driver answers, a file of
fake readings for tests and machines without GPUs, or nothing.

A :class:`GpuSource` returns one :class:`DeviceReading` per device each time it is
read. A source never raises for an unavailable driver or an unreadable file: it
returns no readings (and says why once in the log), so sampling never takes the
server down.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from allotment.domain.resources import Resources

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceReading:
    """One device at one instant: utilisation in percent (0-100), memory used in bytes
    (``None`` when the source cannot tell), and the processes holding memory on it
    (``None`` when the source cannot tell, ``()`` when none)."""

    node: str
    device: int
    utilization: float | None
    memory_used: int | None
    pids: tuple[int, ...] | None = None


class GpuSource(Protocol):
    """Reads every device it knows; must not block for long and never raises."""

    name: str

    def read(self) -> list[DeviceReading]: ...

    def close(self) -> None: ...


class NoSource:
    """No GPU readings at all (jobs' CPU and memory are still sampled)."""

    name = "none"

    def read(self) -> list[DeviceReading]:
        return []

    def close(self) -> None:
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """This machine's GPUs through NVML, reported as devices of ``node``. When the
    library or the driver is missing, :attr:`available` is false and :meth:`read`
    returns nothing."""

    name = "nvml"

    def __init__(self, node: str) -> None:
        self.node = node
        self._nvml: Any = None
        try:
            nvml: Any = importlib.import_module("pynvml")
            nvml.nvmlInit()
        except Exception as exc:  # any NVML failure means "no NVML here"
            log.info("NVML is not available (%s): no GPU readings", exc)
            return
        self._nvml = nvml

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def read(self) -> list[DeviceReading]:
        nvml = self._nvml
        if nvml is None:
            return []
        readings: list[DeviceReading] = []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # a driver gone mid-way: no readings this time
            log.warning("NVML: cannot count devices: %s", exc)
            return []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except Exception as exc:  # one device failing must not hide the others
                log.warning("NVML: cannot read device %d: %s", index, exc)
                continue
            pids: tuple[int, ...] | None
            try:
                procs = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
                with contextlib.suppress(Exception):
                    procs += list(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
                pids = tuple(sorted({int(p.pid) for p in procs}))
            except Exception:  # not supported on this device or driver
                pids = None
            readings.append(
                DeviceReading(
                    node=self.node, device=index, utilization=util, memory_used=used, pids=pids
                )
            )
        return readings

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


class FakeSource:
    """Readings from a file, read again at every :meth:`read`, so a test or a person
    can change them while the server runs. The file (JSON or YAML) maps
    ``node/device`` to ``{utilization: 0-100, memory: bytes or 8Gi, pids: [..]}``::

        {"box/0": {"utilization": 0, "memory": "1Gi"}, "box/1": {"utilization": 90}}

    A missing or malformed file gives no readings (logged when it changes)."""

    name = "fake"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._last_problem: str | None = None

    def read(self) -> list[DeviceReading]:
        try:
            data = yaml.safe_load(self.path.read_text(encoding="utf-8"))
            readings = parse_fake_readings(data if data is not None else {})
        except (OSError, yaml.YAMLError, ValueError, TypeError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._last_problem:
                log.warning("fake telemetry file %s gives no readings: %s", self.path, problem)
            self._last_problem = problem
            return []
        self._last_problem = None
        return readings

    def close(self) -> None:
        return None


def parse_fake_readings(data: object) -> list[DeviceReading]:
    """The readings a fake-telemetry document describes; raises ``ValueError`` naming
    the entry that is wrong."""
    if not isinstance(data, Mapping):
        raise ValueError("expected a mapping of node/device to readings")
    readings: list[DeviceReading] = []
    for where, entry in data.items():
        node, sep, index = str(where).rpartition("/")
        if not sep or not node or not index.isdigit():
            raise ValueError(f"{where!r}: keys are node/device, e.g. box/0")
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where!r}: expected {{utilization, memory, pids}}")
        unknown = set(entry) - {"utilization", "memory", "pids"}
        if unknown:
            raise ValueError(f"{where!r}: unknown keys {sorted(unknown)}")
        util = entry.get("utilization")
        if util is not None and not 0 <= float(util) <= 100:
            raise ValueError(f"{where!r}: utilization must be 0-100")
        memory = entry.get("memory")
        if memory is not None and not isinstance(memory, int):
            memory = Resources.parse({"memory": memory})["memory"] // 1000
        pids = entry.get("pids")
        readings.append(
            DeviceReading(
                node=node,
                device=int(index),
                utilization=None if util is None else float(util),
                memory_used=memory,
                pids=None if pids is None else tuple(int(p) for p in pids),
            )
        )
    return readings


def make_source(
    kind: str | None, *, node: str, file: str | None, base: Path | None = None
) -> GpuSource:
    """The source ``kind`` names (``None``: NVML when a driver answers, else none).
    A relative ``file`` is taken from ``base``."""
    if kind == "fake":
        if file is None:
            raise ValueError("the fake telemetry source needs a file")
        path = Path(file)
        if not path.is_absolute() and base is not None:
            path = base / path
        return FakeSource(path)
    if kind == "none":
        return NoSource()
    nvml = NvmlSource(node)
    if nvml.available or kind == "nvml":
        return nvml
    return NoSource()
