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

:func:`housekeeper_for` and :func:`leader_upkeep` build what the leading server runs
beside its control loop;
:func:`server_upkeep` what every server runs. The composition root (``server.py``)
calls both and hands them the one :class:`~allotment.control.cluster_state.ClusterState`
as a ``cluster()`` callable: upkeep reads the cluster in use, it never holds a copy.
This package imports the domain, the store, the executors' contract and telemetry, never
the control loop: what it needs of the loop (its lock, its wake-up, the orphan tracker)
is handed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.domain.cluster import Cluster
from allotment.upkeep.alerts import MaxWaitCheck
from allotment.upkeep.housekeeper import Housekeeper, housekeeper_for
from allotment.upkeep.webhooks import WebhookDeliveries

__all__ = ["LeaderUpkeep", "housekeeper_for", "leader_upkeep", "server_upkeep"]


@dataclass(frozen=True)
class LeaderUpkeep:
    """What the leader runs: ``steps`` after each scheduling turn, on the loop's thread
    (they must be quick); ``housekeeper`` on a thread started and stopped with the loop."""

    steps: tuple[Callable[[], object], ...]
    housekeeper: Housekeeper


def leader_upkeep(
    housekeeper: Housekeeper, *, on_alert: Callable[[], None] | None = None
) -> LeaderUpkeep:
    """The leader's upkeep around ``housekeeper`` (:func:`housekeeper_for`: on the
    leader's fenced sessions, with the loop runner's wake-up and lock): the
    ``max_wait`` check on the same store, cluster and clock. ``on_alert`` is called when
    alerts fired (it wakes webhook delivery)."""
    alerts = MaxWaitCheck(
        housekeeper.sessions, housekeeper.cluster, clock=housekeeper.clock, on_fired=on_alert
    )
    return LeaderUpkeep(steps=(alerts,), housekeeper=housekeeper)


def server_upkeep(
    cluster: Callable[[], Cluster], sessions: sessionmaker[DbSession], *, clock: Callable[[], float]
) -> WebhookDeliveries:
    """What every server runs, leader or not: webhook delivery (rows are claimed with a
    lease, so two servers never deliver one alert twice). Not started."""
    return WebhookDeliveries(sessions, cluster, clock=clock)
