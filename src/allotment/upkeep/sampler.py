"""The telemetry sampler: GPU readings, the executor's per-replica usage and the open
attempts' allocations, folded into ``job_usage`` and ``device_usage`` per interval.

:meth:`Sampler.sample` takes one sample and writes it in one short transaction;
:meth:`Sampler.prune` deletes what is older than the retention. Neither holds the
control loop's lock: the source and the executor are read outside any transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.lifecycle import ACTIVE, JobState
from allotment.executors.base import ReplicaKey, ReplicaUsage
from allotment.store.allocations import placements_from_json
from allotment.store.usage import add_device_readings, add_job_samples, prune_usage
from allotment.store.views import open_attempts
from allotment.telemetry.aggregate import Holding, interval_start, job_samples
from allotment.telemetry.sources import DeviceReading, GpuSource

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """What one call of :meth:`Sampler.sample` saw: the device readings, the open
    attempts' holdings, and every replica's processes (for orphan detection)."""

    at: float
    readings: list[DeviceReading]
    holdings: list[Holding]
    usage: Mapping[ReplicaKey, ReplicaUsage]


def holdings_of(db: DbSession, usage: Mapping[ReplicaKey, ReplicaUsage]) -> list[Holding]:
    """Every open attempt of an active job, with the devices its allocation names and
    its replicas' measured usage."""
    out: list[Holding] = []
    for job, attempt in open_attempts(db):
        if JobState(job.state) not in ACTIVE:
            continue
        placements = placements_from_json(attempt.allocation)
        replicas = []
        for p in placements:
            measured = usage.get(ReplicaKey(job.id, attempt.number, p.group, p.index))
            if measured is not None:
                replicas.append((measured.cpu_cores, measured.memory_bytes))
        out.append(
            Holding(
                job_id=job.id,
                attempt=attempt.number,
                devices=tuple((p.node, d) for p in placements for d in p.devices),
                replicas=replicas,
            )
        )
    return out


class Sampler:
    """Samples ``source`` and ``usage`` (the executor's :meth:`usage`) into the store.

    ``aggregate_s`` is the length of an interval; ``retention_s`` how long rows are
    kept. ``clock`` returns seconds since the epoch."""

    def __init__(
        self,
        source: GpuSource,
        store_sessions: sessionmaker[DbSession],
        *,
        usage: Callable[[], Mapping[ReplicaKey, ReplicaUsage]],
        clock: Callable[[], float],
        aggregate_s: float,
        retention_s: float,
    ) -> None:
        self.source = source
        self.store_sessions = store_sessions
        self.usage = usage
        self.clock = clock
        self.aggregate_s = aggregate_s
        self.retention_s = retention_s

    def sample(self) -> Sample:
        """Take one sample and store it; return what was seen. Blocks for one short
        transaction."""
        readings = self.source.read()
        try:
            usage = dict(self.usage())
        except OSError as exc:
            log.warning("cannot read the replicas' usage: %s", exc)
            usage = {}
        now = self.clock()
        start = interval_start(now, self.aggregate_s)
        with self.store_sessions.begin() as db:
            holdings = holdings_of(db, usage)
            add_job_samples(
                db, job_samples(holdings, readings), start=start, length=self.aggregate_s
            )
            add_device_readings(db, readings, start=start, length=self.aggregate_s)
        return Sample(at=now, readings=readings, holdings=holdings, usage=usage)

    def prune(self) -> int:
        """Delete rows older than the retention; return how many."""
        with self.store_sessions.begin() as db:
            return prune_usage(db, before=self.clock() - self.retention_s)
