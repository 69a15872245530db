"""Closing an attempt, and what happens to its job then: requeue or retry, or stay ended.

A preempted job is always requeued at once (preemption is not the user's fault), its
event naming the cause and the preemptor. A failed job is retried under its retry
policy — the job spec's ``retry``, else the nearest of its queue and the queue's
ancestors that has one, else none — when its failure class is in the policy's ``on``
and fewer than ``max_attempts`` of its attempts have failed; it goes back to
``pending`` with ``not_before = now + policy.delay(failures)``, and the scheduler
gives it the reason ``backoff`` until then. Otherwise it stays ``failed`` with its
class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession

from allotment.domain.cluster import Cluster, RetryPolicy
from allotment.domain.durations import format_duration
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass, JobState
from allotment.executors.base import ReplicaKey, ReplicaStatus
from allotment.store.jobs import TRANSITION, requeue_job
from allotment.store.models import Attempt, Event, Job


def close_attempt(attempt: Attempt, seen: Mapping[ReplicaKey, ReplicaStatus], now: float) -> None:
    """Mark ``attempt`` ended as :func:`closed_columns` says."""
    for column, value in closed_columns(seen, now, attempt.exit_code, attempt.signal).items():
        setattr(attempt, column, value)


def closed_columns(
    seen: Mapping[ReplicaKey, ReplicaStatus],
    now: float,
    exit_code: int | None,
    signal: int | None,
) -> dict[str, Any]:
    """The columns of an attempt (whose ``exit_code`` and ``signal`` are given) that its
    closing writes: ended when its last replica did (``now`` if none is known), with how
    its replicas ended when not recorded yet: a failing one first (e.g. the SIGKILL that
    ended a preempted replica which ignored SIGTERM)."""
    ends = [s.ended_at for s in seen.values() if s.ended_at is not None]
    columns: dict[str, Any] = {"end_time": max(ends, default=now)}
    if exit_code is None and signal is None:
        ending = sorted(
            (s.exit_code == 0 and s.signal is None, key, s)
            for key, s in seen.items()
            if s.exit_code is not None or s.signal is not None
        )
        if ending:
            columns["exit_code"] = ending[0][2].exit_code
            columns["signal"] = ending[0][2].signal
    return columns


def finish_attempt(
    db: DbSession,
    cluster: Cluster,
    job: Job,
    attempt: Attempt,
    seen: Mapping[ReplicaKey, ReplicaStatus],
    now: float,
) -> bool:
    """Close the attempt of an ended ``job`` (its replicas' last statuses in ``seen``);
    requeue the job if it was preempted, retry it if it failed and its policy allows.
    Return whether it went back to ``pending``."""
    close_attempt(attempt, seen, now)
    return requeue_ended(db, cluster, job, now)


def requeue_ended(db: DbSession, cluster: Cluster, job: Job, now: float) -> bool:
    """After its attempt closed: requeue ``job`` if it was preempted, retry it if it
    failed and its policy allows. Return whether it went back to ``pending``."""
    if job.state == JobState.PREEMPTED.value:
        requeue_preempted(db, job, now)
        return True
    return job.state == JobState.FAILED.value and retry_failed(db, cluster, job, now) is not None


def retry_policy(spec: JobSpec, cluster: Cluster) -> RetryPolicy | None:
    """The policy that governs ``spec``'s retries, or ``None`` (no retries)."""
    if spec.retry is not None:
        return spec.retry
    queue = cluster.queues.get(spec.queue)
    return None if queue is None else queue.inherited(lambda q: q.retry)


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """One planned retry: the ``number``-th of at most ``of``, after ``delay`` seconds."""

    number: int
    of: int
    delay: float
    failure: FailureClass

    @property
    def message(self) -> str:
        return (
            f"retry {self.number} of {self.of} in {format_duration(self.delay)} "
            f"after {self.failure.value}"
        )


def plan_retry(policy: RetryPolicy | None, failure: FailureClass, failures: int) -> Retry | None:
    """The retry after the ``failures``-th failed attempt (ended by ``failure``), or
    ``None`` when the policy does not allow one."""
    if policy is None or failure not in policy.on or failures >= policy.max_attempts:
        return None
    return Retry(
        number=failures,
        of=policy.max_attempts - 1,
        delay=policy.delay(failures),
        failure=failure,
    )


def failed_attempts(db: DbSession, job_id: str) -> int:
    """How many of the job's attempts ended ``failed`` (preempted ones do not count)."""
    query = select(func.count()).where(
        Attempt.job_id == job_id, Attempt.state == JobState.FAILED.value
    )
    return int(db.scalar(query) or 0)


def retry_failed(db: DbSession, cluster: Cluster, job: Job, now: float) -> Retry | None:
    """Requeue the failed ``job`` if its policy allows; return the retry made, or
    ``None`` when it stays failed."""
    if job.failure_class is None:
        return None
    failure = FailureClass(job.failure_class)
    policy = retry_policy(JobSpec.model_validate(job.spec), cluster)
    retry = plan_retry(policy, failure, failed_attempts(db, job.id))
    if retry is None:
        return None
    requeue_job(
        db,
        job.id,
        at=now,
        not_before=now + retry.delay,
        message=retry.message,
        detail={
            "attempt": job.attempt,
            "retry": retry.number,
            "of": retry.of,
            "delay_s": retry.delay,
            "failure_class": failure.value,
        },
    )
    return retry


def requeue_preempted(db: DbSession, job: Job, now: float) -> None:
    """Requeue the preempted ``job`` at once, naming the preemption's cause."""
    cause = _preemption_detail(db, job.id)
    requeue_job(
        db,
        job.id,
        at=now,
        not_before=None,
        message="requeued after preemption",
        detail={"attempt": job.attempt, **cause},
    )


def _preemption_detail(db: DbSession, job_id: str) -> dict[str, Any]:
    query = (
        select(Event)
        .where(
            Event.job_id == job_id,
            Event.kind == TRANSITION,
            Event.to_state == JobState.PREEMPTED.value,
        )
        .order_by(Event.id.desc())
        .limit(1)
    )
    event = db.scalars(query).first()
    if event is None:
        return {}
    detail = dict(event.detail or {})
    return {k: detail[k] for k in ("cause", "preemptor") if k in detail}
