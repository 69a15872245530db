"""Periodic upkeep beside the scheduler, every task listed here.

On the leading server, on the housekeeper's thread (:mod:`.housekeeper`), every
``telemetry.interval``:

- a telemetry sample: GPU readings, replicas' CPU and memory (:mod:`.sampler`);
- the orphan GPU process check on those readings (the loop's orphan tracker);
- idle and TTL reaping (:mod:`.reaping`);
- scratch expiry, every minute (:mod:`.scratch`);
- retention, every hour: usage rows (:mod:`.sampler`) and submissions' idempotency
  keys (:mod:`allotment.store.idempotency`).

On the leading server, after each scheduling turn, at most every second:

- ``max_wait`` alerts (:mod:`.alerts`).

On every server, leader or not, on a thread of its own, when an alert fires and
polled every second:

- webhook delivery (:mod:`.webhooks`).

:func:`leader_upkeep` builds what the leading server runs beside its control loop;
:func:`server_upkeep` what every server runs. The composition root (``server.py``)
calls both and hands them the one :class:`~allotment.control.cluster_state.ClusterState`
as a ``cluster()`` callable: upkeep reads the cluster in use, it never holds a copy.
This package imports the domain, the store, the executors' contract and telemetry, never
the control loop: what it needs of the loop (its lock, its wake-up, the orphan tracker)
is handed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.cluster import Cluster
from allotment.executors.base import ReplicaKey, ReplicaUsage
from allotment.upkeep.alerts import MaxWaitCheck
from allotment.upkeep.housekeeper import Housekeeper, OrphanCheck, housekeeper_for
from allotment.upkeep.webhooks import WebhookDeliveries


@dataclass(frozen=True)
class LeaderUpkeep:
    """What the leader runs: ``steps`` after each scheduling turn, on the loop's thread
    (they must be quick); ``housekeeper`` on a thread started and stopped with the loop."""

    steps: tuple[Callable[[], object], ...]
    housekeeper: Housekeeper


def leader_upkeep(
    cluster: Callable[[], Cluster],
    sessions: sessionmaker[DbSession],
    *,
    usage: Callable[[], Mapping[ReplicaKey, ReplicaUsage]],
    clock: Callable[[], float],
    work_root: Path,
    orphan_gpus: OrphanCheck,
    wake: Callable[[], None],
    lock: AbstractContextManager[object],
    on_alert: Callable[[], None] | None = None,
    base: Path | None = None,
) -> LeaderUpkeep:
    """The leader's upkeep on its fenced ``sessions``. ``wake`` and ``lock`` are the loop
    runner's; ``on_alert`` is called when alerts fired (wakes webhook delivery);
    ``base`` is where a relative fake-telemetry file is read from."""
    alerts = MaxWaitCheck(sessions, cluster, clock=clock, on_fired=on_alert)
    keeper = housekeeper_for(
        cluster,
        sessions,
        usage=usage,
        clock=clock,
        work_root=work_root,
        orphan_gpus=orphan_gpus,
        wake=wake,
        lock=lock,
        base=base,
    )
    return LeaderUpkeep(steps=(alerts,), housekeeper=keeper)


def server_upkeep(
    cluster: Callable[[], Cluster], sessions: sessionmaker[DbSession], *, clock: Callable[[], float]
) -> WebhookDeliveries:
    """What every server runs, leader or not: webhook delivery (rows are claimed with a
    lease, so two servers never deliver one alert twice). Not started."""
    return WebhookDeliveries(sessions, cluster, clock=clock)
