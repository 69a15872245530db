"""The control loop's core: store → scheduler session → one transaction → executor.

:meth:`ControlLoop.cycle` runs one scheduling cycle on a scheduler
:class:`~allotment.scheduler.session.Session` rebuilt from the store, writes every
decision in one transaction (admissions with their attempt rows, waiting reasons,
preemption victims) and only after the commit drives the executor: launches of
admitted jobs, stops of victims. Executor actions are idempotent per (job, attempt,
replica), and every job the store calls ``admitted`` is (re)launched
on each cycle and reconciliation, so a crash between the commit and the launch is
repaired by calling :meth:`ControlLoop.cycle` or :meth:`ControlLoop.reconcile` again.

:meth:`ControlLoop.observe` turns what the executor sees into lifecycle moves, planned
per job and written together (:mod:`.observe`, through
:func:`~allotment.store.jobs.transition_jobs`); :meth:`ControlLoop.reconcile` finds
zombies (jobs the store believes run but whose replicas the executor has lost) and
orphans (replicas nobody in the store owns), each reported (:mod:`.orphans`).

An attempt is *open* from its admission until every replica of it has ended: only then
are its resources given back to the session (``gone``) and is the job requeued or
retried (see :mod:`allotment.control.retries`). A job cancelled in the store while it
holds an allocation has its replicas stopped by the next :meth:`ControlLoop.observe`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from allotment.control.cluster_state import ClusterState
from allotment.control.launch import launch_attempt, replica_keys
from allotment.control.observe import Plan, plan, write
from allotment.control.orphans import OrphanTracker
from allotment.control.pending import PendingFeed, pending_ids
from allotment.control.retries import finish_attempt
from allotment.control.writes import Move, admit, launched, preempt
from allotment.domain.cluster import Cluster
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import ACTIVE, FailureClass, JobState
from allotment.domain.reasons import Reason
from allotment.executors.base import (
    Executor,
    ReplicaKey,
    ReplicaPhase,
    ReplicaStatus,
)
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import (
    PendingJob,
    RunningJob,
    SchedulerPolicy,
)
from allotment.store.jobs import (
    jobs_by_id,
    record_reasons,
    sync_attempt,
    transition_job,
)
from allotment.store.models import Attempt, Job
from allotment.store.views import (
    open_attempt_rows,
    open_attempts,
    pending_of,
    pending_rows,
    running_of,
)

log = logging.getLogger(__name__)

DEFAULT_STOP_GRACE_S = 30.0
"""Seconds between SIGTERM and SIGKILL when the loop stops a replica."""

_S = JobState
REASON_REFRESH_S = 10.0
"""How often at most a waiting job's reason message is rewritten while its code stays."""


class ControlLoop:
    """Drives one cluster: scheduler session, store and executor.

    ``store_sessions`` makes database sessions; ``clock`` returns seconds since the
    epoch and must not go backwards. ``work_root`` holds each attempt's working
    directory (``work_root/<tenant>/<job>/<attempt>``, mode 0o700). Nothing is read
    before the first call.
    """

    def __init__(
        self,
        cluster: Cluster | ClusterState,
        store_sessions: sessionmaker[DbSession],
        executor: Executor,
        *,
        work_root: Path,
        clock: Callable[[], float],
        policy: SchedulerPolicy | None = None,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
    ) -> None:
        self.state = ClusterState.of(cluster)
        """The cluster in use, owned outside the loop (the server's, shared with the API)."""
        self._version, self.cluster = self.state.snapshot()
        """The cluster this turn works on: taken from :attr:`state` at each turn's start."""
        self.store_sessions = store_sessions
        self.executor = executor
        self.work_root = Path(work_root)
        self.clock = clock
        self.policy = policy
        self.stop_grace_s = stop_grace_s
        self._session: Session | None = None
        self._stop_sent: set[str] = set()
        """Jobs whose replicas this loop has asked to stop (until their attempt closes)."""
        self.orphans = OrphanTracker(policy=lambda: self.cluster.source.orphans)
        self._reasons: dict[str, tuple[str, str, float]] = {}
        """Waiting reason (code, message, when written) the store holds for each job that
        waited in the last cycle, so that an unchanged one is not read again."""
        self.pending_feed = PendingFeed()
        """Which jobs joined or left ``pending`` between turns (see :mod:`.pending`)."""

    # ------------------------------------------------------------------ state

    @property
    def session(self) -> Session:
        """The scheduler session, rebuilt from the store on first use."""
        if self._session is None:
            return self.rebuild()
        return self._session

    def rebuild(self) -> Session:
        """A fresh scheduler session from the store: every open attempt holds its
        allocation (stopping, when its job already ended or was preempted), every
        pending job waits in its line."""
        self._take_nodes()
        self._version, self.cluster = self.state.snapshot()
        now = self.clock()
        session = Session(self.cluster, self.policy, now=now)
        with self.store_sessions() as db:
            self.pending_feed.restart(db, now)  # first: what commits meanwhile comes next turn
            for job, attempt in open_attempts(db):
                session.started(self._running(job, attempt))
                if _S(job.state) not in ACTIVE:
                    session.stopping(job.id)
            for job in pending_rows(db):
                if job.id not in session.running:
                    session.submit(self._pending(job))
        self._session = session
        self._reasons.clear()
        return session

    def invalidate(self) -> None:
        """Forget the scheduler session: the next call rebuilds it from the store (after
        a failed turn, or when the cluster changed)."""
        self._session = None

    def sync(self) -> bool:
        """Take the cluster in use at the start of a turn; when it changed (a new
        configuration, or nodes), the scheduler session is rebuilt on it. Returns
        whether it changed."""
        version, cluster = self.state.snapshot()
        if version == self._version:
            return False
        self._version, self.cluster = version, cluster
        self.invalidate()
        return True

    # ------------------------------------------------------------------ cycle

    def cycle(self) -> Decisions:
        """One scheduling cycle; its decisions are committed together, then acted on."""
        self.sync()
        session = self.session
        self._sync_pending(session)
        # After the read: every job it found was submitted (and committed) before now, so
        # no admission is stamped earlier than its job's submission.
        now = self.clock()
        session.occupy(self.orphans.foreign)  # devices orphan processes hold
        decisions = session.cycle(now)
        try:
            with self.store_sessions.begin() as db:
                # The admitted jobs locked in one query, their moves written together.
                withdrawn = admit(db, decisions.admitted, now)
                self._record_waiting(db, decisions.waiting, now)
                victims = preempt(db, decisions.preemptions, now)
        except Exception:
            self._session = None  # the session ran ahead of the store: rebuild it
            raise
        for job_id in withdrawn:
            session.gone(job_id)  # its admission is void: the resources are free again
        for job_id in victims:
            session.stopping(job_id)
        self._stop_jobs(victims)
        self._launch_admitted()
        return decisions

    def _record_waiting(self, db: DbSession, waiting: Mapping[str, Reason], now: float) -> None:
        """Keep each waiting job's reason in the store. A new reason code is written at
        once; a new message under the same code (``behind j-7`` becoming ``behind j-9``
        as the line moves) at most every :data:`REASON_REFRESH_S` per job, so that a long
        backlog does not rewrite thousands of rows and events every cycle. Only reasons
        that differ from what the store holds (see :attr:`_reasons`) are read at all."""
        known = self._reasons
        fresh: dict[str, Reason] = {}
        remembered: dict[str, tuple[str, str, float]] = {}
        for job_id, reason in waiting.items():
            code, message = reason.code.value, reason.message
            held = known.get(job_id)
            if held is not None and (
                (held[0], held[1]) == (code, message)
                or (held[0] == code and now - held[2] < REASON_REFRESH_S)
            ):
                remembered[job_id] = held
                continue
            fresh[job_id] = reason
            remembered[job_id] = (code, message, now)
        record_reasons(db, fresh, at=now, states=(_S.PENDING,))
        # Only this cycle's waiting jobs are remembered (a failed transaction clears it).
        self._reasons = remembered

    def _sync_pending(self, session: Session) -> None:
        """Pending jobs the store has and the session lacks join it; those the store no
        longer calls pending leave it. Reads only the jobs whose moves entered or left
        ``pending`` since the last turn (:class:`PendingFeed`), every pending id now and
        then, and whole rows only of the jobs the session lacks."""
        with self.store_sessions() as db:
            changed = self.pending_feed.changes(db, self.clock())
            in_store = pending_ids(db, changed)
            held = {job.id for job in session.pending()} if changed is None else changed
            leaving = sorted(held - in_store)
            new = [
                job_id
                for job_id in in_store
                if session.pending_job(job_id) is None and job_id not in session.running
            ]
            rows = jobs_by_id(db, new) if new else []
        for row in rows:
            if row.state == _S.PENDING.value:
                session.submit(self._pending(row))
        for job_id in leaving:
            if session.pending_job(job_id) is not None:
                session.withdraw(job_id)

    def _launch_admitted(self) -> list[Move]:
        """Launch every replica of every admitted job (idempotent), then move it to
        ``starting``: all launches first, then their moves in one transaction."""
        with self.store_sessions() as db:
            rows = [
                (
                    job.id,
                    job.tenant,
                    JobSpec.model_validate(job.spec),
                    attempt.number,
                    attempt.allocation,
                )
                for job, attempt in open_attempts(db, states=(_S.ADMITTED,))
            ]
        if not rows:
            return []
        failures = {
            row[0]: launch_attempt(self.executor, self.cluster, self.work_root, *row)
            for row in rows
        }
        attempts = [(row[0], row[3], len(row[4])) for row in rows]
        with self.store_sessions.begin() as db:
            moves = launched(db, attempts, failures, self.clock())
        for job_id, _tenant, _spec, number, allocation in rows:
            if failures[job_id] is not None:
                self._stop_keys(replica_keys(job_id, number, allocation))
        return moves

    def refresh_nodes(self) -> bool:
        """Take the executor's nodes (Slurm's inventory and health) when it reports
        them and they changed: the scheduler session is rebuilt on them, so a node gone
        down gets no new work until it returns. Returns whether they changed."""
        self._take_nodes()
        return self.sync()

    def _take_nodes(self) -> bool:
        nodes = self.executor.nodes(self.state.current())
        return nodes is not None and self.state.take_nodes(nodes)

    # ------------------------------------------------------------------ events

    def observe(self) -> list[Move]:
        """Apply what the executor sees to the lifecycle; return the moves made.

        ``starting → running`` once every replica has started; ``→ succeeded`` when all
        exited 0; ``→ failed`` (class from :func:`classify`) when one failed, the others
        being stopped. The replicas of a job that is no longer active (cancelled through
        the API, say) are stopped and its resources marked stopping. An attempt whose
        job is no longer active is closed once all its replicas ended: its resources
        are freed, and the job requeued or retried (:mod:`allotment.control.retries`).
        Replicas the executor does not know are left to :meth:`reconcile`.
        """
        self.refresh_nodes()
        statuses = self.executor.observe()
        session = self.session
        now = self.clock()
        plans: list[Plan] = []
        with self.store_sessions.begin() as db:
            for row in open_attempt_rows(db, lock=True):
                planned = plan(row, statuses, now, stop_sent=row.job in self._stop_sent)
                if planned is None:
                    continue
                if planned.failed:
                    self._stop_sent.add(row.job)
                plans.append(planned)
            # The moves of all jobs together (see :mod:`.observe`).
            moves, requeued = write(db, self.cluster, plans, now)
        for planned in plans:
            if planned.stopping:
                self._stop_sent.add(planned.job)
                session.stopping(planned.job)
        gone = [p.job for p in plans if p.closes]
        self._settle(session, gone, [self._pending(job) for job in requeued])
        self._stop_keys(list(dict.fromkeys(k for p in plans for k in p.to_stop)))
        return moves

    def _finish(
        self,
        db: DbSession,
        job: Job,
        attempt: Attempt,
        seen: Mapping[ReplicaKey, ReplicaStatus],
        now: float,
        moves: list[Move],
        requeued: list[PendingJob],
    ) -> None:
        """Close the attempt of an ended job, which may go back to pending."""
        state = _S(job.state)
        if finish_attempt(db, self.cluster, job, attempt, seen, now):
            moves.append(Move(job=job.id, source=state, target=_S.PENDING))
            requeued.append(self._pending(job))

    def _move(
        self,
        db: DbSession,
        job: Job,
        target: JobState,
        now: float,
        message: str,
        moves: list[Move],
        *,
        failure: FailureClass | None = None,
        detail: dict[str, Any] | None = None,
    ) -> JobState:
        source = _S(job.state)
        transition_job(
            db,
            job.id,
            target,
            job=job,  # locked by open_attempts(db, lock=True)
            at=now,
            message=message,
            detail=detail,
            failure_class=failure,
        )
        sync_attempt(db, job)
        moves.append(Move(job=job.id, source=source, target=target, failure=failure))
        return target

    # ------------------------------------------------------------------ reconcile

    def reconcile(self) -> list[ReplicaKey]:
        """Compare the store with the executor; return the orphans.

        A starting or running job with a replica the executor does not know, or reports
        ``lost``, is a zombie: it fails with ``node_failure`` (and is retried when its
        policy retries ``node_failure``), its other replicas are stopped, and it is
        reported. A replica that has not ended and belongs to no open attempt is an
        orphan: reported, returned, and stopped only under ``orphans: kill``. Also repeats
        what a crash may have cut short: launching admitted jobs, stopping replicas of
        ended or preempted jobs.
        """
        self.sync()
        statuses = self.executor.observe()
        session = self.session
        now = self.clock()
        known: set[ReplicaKey] = set()
        to_stop: list[ReplicaKey] = []
        gone: list[str] = []
        moves: list[Move] = []
        requeued: list[PendingJob] = []
        with self.store_sessions.begin() as db:
            for job, attempt in open_attempts(db, lock=True):
                keys = replica_keys(job.id, attempt.number, attempt.allocation)
                known.update(keys)
                state = _S(job.state)
                alive = [k for k in keys if k in statuses and not statuses[k].ended]
                if state not in ACTIVE:
                    to_stop.extend(alive)
                    continue
                if state is _S.ADMITTED:
                    continue
                missing = [str(k) for k in keys if k not in statuses]
                lost = [str(k) for k in keys if k in statuses and statuses[k].phase is _LOST]
                if not missing and not lost:
                    continue
                self._move(
                    db,
                    job,
                    _S.FAILED,
                    now,
                    "zombie: the executor lost its replicas",
                    moves,
                    failure=FailureClass.NODE_FAILURE,
                    detail={"missing": missing, "lost": lost},
                )
                self.orphans.zombie(db, job, attempt.number, now, statuses, keys)
                to_stop.extend(alive)
                if not alive:
                    ended = {k: statuses[k] for k in keys if k in statuses}
                    self._finish(db, job, attempt, ended, now, moves, requeued)
                    gone.append(job.id)
            orphans = sorted(k for k, s in statuses.items() if not s.ended and k not in known)
            to_stop.extend(self.orphans.replicas(db, orphans, statuses, now))
        self._settle(session, gone, requeued)
        self._stop_keys(to_stop)
        self._launch_admitted()
        return orphans

    # ------------------------------------------------------------------ helpers

    def _settle(self, session: Session, gone: list[str], requeued: list[PendingJob]) -> None:
        """Closed attempts free their resources; requeued jobs join their lines."""
        for job_id in gone:
            self._stop_sent.discard(job_id)
            session.gone(job_id)
        for pending in requeued:
            if session.pending_job(pending.id) is None:
                session.submit(pending)

    def _stop_jobs(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        self._stop_sent.update(job_ids)
        with self.store_sessions() as db:
            keys = [
                key
                for job, attempt in open_attempts(db)
                if job.id in set(job_ids)
                for key in replica_keys(job.id, attempt.number, attempt.allocation)
            ]
        self._stop_keys(keys)

    def _stop_keys(self, keys: Sequence[ReplicaKey]) -> None:
        for key in keys:
            try:
                self.executor.stop(key, self.stop_grace_s)
            except OSError as exc:  # reconciliation will try again
                log.warning("could not stop %s: %s", key, exc)

    def _pending(self, job: Job) -> PendingJob:
        return pending_of(job, self.cluster)

    def _running(self, job: Job, attempt: Attempt) -> RunningJob:
        return running_of(job, attempt, self.cluster)


_LOST = ReplicaPhase.LOST
