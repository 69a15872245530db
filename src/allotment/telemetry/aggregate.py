"""From one instant's readings to per-job and per-device samples, and from samples to
per-interval aggregates (averages and maxima), without I/O.

A job's GPU utilisation at one instant is the mean over its allocated devices that
were read, and its peak that of the busiest of them; its GPU memory the sum over them.
Its CPU (cores) and memory (bytes) are the sums over its replicas. An aggregate folds
the samples of one interval ``[start, start + length)`` into a count, an average and a
maximum; a value nobody measured stays ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allotment.telemetry.sources import DeviceReading


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSample:
    """One attempt of a job at one instant."""

    job_id: str
    attempt: int
    gpus: int
    gpu_util: float | None = None
    gpu_util_peak: float | None = None
    """The busiest device's utilisation: a job is idle only when every device is."""
    gpu_memory: int | None = None
    cpu: float | None = None
    memory: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Aggregate:
    """Samples of one interval folded together (the columns of ``job_usage`` and
    ``device_usage``)."""

    samples: int
    util_avg: float | None = None
    util_max: float | None = None
    gpu_memory_max: int | None = None
    cpu_avg: float | None = None
    memory_max: int | None = None


def interval_start(at: float, length: float) -> float:
    """The start of the interval of ``length`` seconds that holds ``at``."""
    return math.floor(at / length) * length


def _avg(old: float | None, count: int, new: float | None) -> float | None:
    """The running mean after one more sample; samples without a value count as none."""
    if new is None:
        return old
    if old is None:
        return new
    return (old * count + new) / (count + 1)


def _max(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None else max(old, new)


def _max_int(old: int | None, new: int | None) -> int | None:
    if new is None:
        return old
    return new if old is None else max(old, new)


def fold(
    old: Aggregate | None,
    *,
    util: float | None = None,
    util_peak: float | None = None,
    gpu_memory: int | None = None,
    cpu: float | None = None,
    memory: int | None = None,
) -> Aggregate:
    """``old`` with one more sample (``old`` is ``None`` for an interval's first).
    ``util_max`` is the maximum of ``util_peak`` (else ``util``) over the samples.

    The running mean weights every earlier sample equally, which is exact when each
    sample of the interval measured the same columns (the sampler's case)."""
    count = 0 if old is None else old.samples
    base = old or Aggregate(samples=0)
    return Aggregate(
        samples=count + 1,
        util_avg=_avg(base.util_avg, count, util),
        util_max=_max(base.util_max, util if util_peak is None else util_peak),
        gpu_memory_max=_max_int(base.gpu_memory_max, gpu_memory),
        cpu_avg=_avg(base.cpu_avg, count, cpu),
        memory_max=_max_int(base.memory_max, memory),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """An open attempt and what it holds: ``devices`` as ``(node, index)`` pairs, and
    its replicas' ``(cpu cores, memory bytes)`` where the executor measured them."""

    job_id: str
    attempt: int
    devices: tuple[tuple[str, int], ...]
    replicas: Sequence[tuple[float | None, int | None]] = ()


def job_samples(holdings: Iterable[Holding], readings: Sequence[DeviceReading]) -> list[JobSample]:
    """One sample per holding from this instant's device readings and replica usage."""
    by_device = {(r.node, r.device): r for r in readings}
    out: list[JobSample] = []
    for held in holdings:
        read = [by_device[d] for d in held.devices if d in by_device]
        utils = [r.utilization for r in read if r.utilization is not None]
        memories = [r.memory_used for r in read if r.memory_used is not None]
        cpus = [c for c, _ in held.replicas if c is not None]
        rss = [m for _, m in held.replicas if m is not None]
        out.append(
            JobSample(
                job_id=held.job_id,
                attempt=held.attempt,
                gpus=len(held.devices),
                gpu_util=sum(utils) / len(utils) if utils else None,
                gpu_util_peak=max(utils) if utils else None,
                gpu_memory=sum(memories) if memories else None,
                cpu=sum(cpus) if cpus else None,
                memory=sum(rss) if rss else None,
            )
        )
    return out


def owners(holdings: Iterable[Holding]) -> Mapping[tuple[str, int], str]:
    """Which job holds each ``(node, device)``."""
    return {device: held.job_id for held in holdings for device in held.devices}
