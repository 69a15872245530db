"""Zombies and orphans: each one found is reported (an event, an audit record
by ``allotment`` with the evidence, a log line) and counted; orphans are cleaned when
the cluster's ``orphans`` policy says ``kill`` and they are provably orphans.

- A **zombie** is a job the store says runs whose replicas the executor lost; the
  control loop's reconciliation fails it (``node_failure``) and calls
  :func:`report_zombie`.
- An **orphan replica** is one the executor runs that belongs to no open attempt.
  Under ``kill`` it is stopped once two reconciliations in a row found it so (an
  attempt is written before its replicas are launched, so a replica without one is
  not about to be claimed).
- An **orphan GPU process** holds GPU memory and belongs to no running replica. Under
  ``kill`` it is killed only when its environment names an Allotment job attempt
  (``ALLOTMENT_JOB_ID``, ``ALLOTMENT_ATTEMPT``) that has no open attempt in the store,
  and two samples in a row found it: anything else (a desktop, another user's
  program) is reported, never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from allotment.executors.base import ReplicaKey, ReplicaStatus
from allotment.executors.procfs import environment
from allotment.store import audit
from allotment.store.models import Attempt, Event, Job
from allotment.telemetry.sources import DeviceReading

log = logging.getLogger(__name__)

ZOMBIE = "zombie"
ORPHAN_REPLICA = "orphan_replica"
ORPHAN_GPU_PROCESS = "orphan_gpu_process"
"""Event kinds; the audit actions are ``job.zombie``, ``orphan.replica`` and
``orphan.gpu_process``."""


def _report(
    db: DbSession,
    *,
    now: float,
    kind: str,
    action: str,
    job_id: str | None,
    tenant: str | None,
    obj: str,
    message: str,
    detail: dict[str, Any],
) -> None:
    db.add(Event(job_id=job_id, at=now, kind=kind, message=message, detail=detail))
    audit.append_system(db, at=now, tenant=tenant, action=action, object=obj, detail=detail)
    log.warning("%s: %s", kind, message)


def report_zombie(
    db: DbSession, job: Job, attempt: int, now: float, evidence: dict[str, Any]
) -> None:
    """Report a zombie found by reconciliation, in its transaction."""
    _report(
        db,
        now=now,
        kind=ZOMBIE,
        action="job.zombie",
        job_id=job.id,
        tenant=job.tenant,
        obj=job.id,
        message=f"zombie: the store said {job.state}, the executor runs nothing of attempt "
        f"{attempt}",
        detail={"attempt": attempt, "state": job.state, **evidence},
    )


def status_evidence(status: ReplicaStatus | None) -> dict[str, Any]:
    """What the executor said of one replica, for the record."""
    if status is None:
        return {"phase": "unknown to the executor"}
    return {"phase": status.phase.value, "pid": status.pid, "detail": status.detail}


@dataclass
class OrphanTracker:
    """Remembers which orphans were reported (each is reported once per server run)
    and which were seen by the previous pass (to confirm before killing), and counts
    what was found."""

    policy: Callable[[], str] = field(default=lambda: "report")
    """The ``orphans`` policy in force (``report`` or ``kill``), read at every pass."""
    kill: Callable[[int], None] = field(default=lambda pid: _sigkill(pid))
    counts: dict[str, int] = field(default_factory=dict)
    _reported: set[str] = field(default_factory=set)
    """Orphans reported and still seen (one gone is forgotten: memory stays bounded)."""
    foreign: frozenset[tuple[str, int]] = frozenset()
    """The devices (node, index) that the last pass found held by a process no running
    replica owns and that it did not kill: the control loop gives them to no job."""
    _previous_replicas: set[ReplicaKey] = field(default_factory=set)
    _previous_pids: set[int] = field(default_factory=set)

    def _forget(self, tags: set[str]) -> None:
        self._reported -= tags

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def zombie(
        self,
        db: DbSession,
        job: Job,
        attempt: int,
        now: float,
        statuses: Mapping[ReplicaKey, ReplicaStatus],
        keys: Iterable[ReplicaKey],
    ) -> None:
        """Report and count a zombie: what the executor said of each of its replicas
        ``keys`` is the evidence."""
        self.count(ZOMBIE)
        evidence = {str(k): status_evidence(statuses.get(k)) for k in keys}
        report_zombie(db, job, attempt, now, {"replicas": evidence})

    def replicas(
        self,
        db: DbSession,
        orphans: Sequence[ReplicaKey],
        statuses: Mapping[ReplicaKey, ReplicaStatus],
        now: float,
    ) -> list[ReplicaKey]:
        """Report new orphan replicas; under ``kill``, return those confirmed (to be
        stopped by the caller after the commit)."""
        confirmed = [k for k in orphans if k in self._previous_replicas]
        self._forget({str(k) for k in self._previous_replicas} - {str(k) for k in orphans})
        self._previous_replicas = set(orphans)
        for key in orphans:
            if str(key) in self._reported:
                continue
            self._reported.add(str(key))
            self.count(ORPHAN_REPLICA)
            _report(
                db,
                now=now,
                kind=ORPHAN_REPLICA,
                action="orphan.replica",
                job_id=None,
                tenant=None,
                obj=str(key),
                message=f"orphan replica {key}: no open attempt owns it (policy {self.policy()})",
                detail={
                    "replica": str(key),
                    "policy": self.policy(),
                    **status_evidence(statuses.get(key)),
                },
            )
        return confirmed if self.policy() == "kill" else []

    def gpu_processes(
        self,
        db: DbSession,
        readings: Iterable[DeviceReading],
        owned: set[int],
        now: float,
        *,
        env_of: Callable[[int], dict[str, str] | None] = environment,
    ) -> list[int]:
        """Report GPU processes no running replica owns; under ``kill``, kill those
        provably left by an ended Allotment attempt. Returns the pids killed; the devices
        the others hold become :attr:`foreign`."""
        held: dict[int, list[str]] = {}
        places: dict[int, list[tuple[str, int]]] = {}
        for reading in readings:
            for pid in reading.pids or ():
                if pid not in owned:
                    held.setdefault(pid, []).append(f"{reading.node}/{reading.device}")
                    places.setdefault(pid, []).append((reading.node, reading.device))
        confirmed = set(held) & self._previous_pids
        self._forget({f"gpu-pid:{pid}" for pid in self._previous_pids - set(held)})
        self._previous_pids = set(held)
        killed: list[int] = []
        for pid, devices in sorted(held.items()):
            env = env_of(pid) or {}
            job_id = env.get("ALLOTMENT_JOB_ID")
            attempt = env.get("ALLOTMENT_ATTEMPT")
            provable = (
                job_id is not None
                and attempt is not None
                and attempt.isdigit()
                and not _attempt_open(db, job_id, int(attempt))
            )
            tag = f"gpu-pid:{pid}"
            if tag not in self._reported:
                self._reported.add(tag)
                self.count(ORPHAN_GPU_PROCESS)
                _report(
                    db,
                    now=now,
                    kind=ORPHAN_GPU_PROCESS,
                    action="orphan.gpu_process",
                    job_id=None,
                    tenant=None,
                    obj=tag,
                    message=f"process {pid} holds GPU memory on {', '.join(devices)} and "
                    "belongs to no running job"
                    + (f" (left by {job_id} attempt {attempt})" if provable else ""),
                    detail={
                        "pid": pid,
                        "devices": devices,
                        "job": job_id,
                        "attempt": attempt,
                        "provable": provable,
                        "policy": self.policy(),
                    },
                )
            if self.policy() == "kill" and provable and pid in confirmed:
                self.kill(pid)
                killed.append(pid)
                log.warning("killed orphan GPU process %d of %s attempt %s", pid, job_id, attempt)
        self.foreign = frozenset(d for pid, ds in places.items() if pid not in killed for d in ds)
        return killed


def _attempt_open(db: DbSession, job_id: str, attempt: int) -> bool:
    row = db.scalars(
        select(Attempt).where(Attempt.job_id == job_id, Attempt.number == attempt)
    ).one_or_none()
    return row is not None and row.end_time is None


def _sigkill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
