"""Idle and TTL reaping: rows in, decisions out, then one writer.

Reaping stops running jobs that waste what they hold: GPUs left idle too long, or a
type that outlived its time to live. A reaped job ends in the state ``reclaimed`` (its
resources are taken back as waste). It is not *reclaim*, which is the scheduler taking a
queue's guaranteed quota back from borrowers by preemption.

:func:`decide` is pure. For each running attempt it takes the queue's
:class:`~allotment.domain.upkeep.ReapingPolicy` (its ``reaping`` key; for a notebook
with its own ``ttl`` or ``idle_timeout``, those on top: the shorter applies) and the
attempt's ``job_usage`` rows:

- **TTL**: a job type with a ``ttl`` that has run that long is reaped (``ttl``).
- **Idle**: the *idle run* is the trailing sequence of adjacent intervals whose every
  sample (``gpu_util_max``) was below the threshold. It counts from the *end* of its
  first interval (what happened between the last busy sample and the first idle one is
  unknown, so it is not counted) or the attempt's start if later, up to the end of the
  newest interval or now if earlier. Once it reaches ``window - warn_before`` the job is
  warned; it is reaped (``idle``) once it reaches ``window`` *and* ``warn_before``
  has passed since a warning given during this run. A busy sample ends the run: the
  next one needs a new warning. Jobs without GPUs, exempt types, and jobs whose newest
  row is stale (the sampler stalled) are never reaped for idleness. A notebook whose
  JupyterLab reports its last activity (:mod:`.notebooks`) is idle only since then: a
  user running cells on the CPU keeps it, though its GPUs sit idle.

A service's first ``min`` replicas are never reaped (its replicas above the minimum
may be, like any job; the service controller then wants one replica fewer).

:func:`apply` writes the decisions: a warning is an ``idle_warning`` event and alert;
a reaping moves the job to ``reclaimed`` (the transition event carries the reason
and the evidence) and appends an audit record ``job.reap`` by ``allotment``. The
control loop then stops the replicas and frees the resources, as for a cancel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from allotment.domain.cluster import Cluster
from allotment.domain.durations import format_duration
from allotment.domain.job import NotebookSettings
from allotment.domain.lifecycle import JobState
from allotment.domain.upkeep import ReapingPolicy
from allotment.store import audit
from allotment.store.alerts import NewAlert, fire_alert
from allotment.store.jobs import get_job, sync_attempt, transition_job
from allotment.store.models import Alert, Event
from allotment.store.services import protected_replicas
from allotment.store.usage import job_usage_rows
from allotment.store.views import open_attempts
from allotment.upkeep.notebooks import kernel_activity

IDLE_WARNING = "idle_warning"
NOTEBOOK = "notebook"
"""Event and alert kind of a warning before an idle job is reaped."""
REAP_ACTION = "job.reap"
MAX_EVIDENCE = 120
"""At most this many intervals are copied into an event as evidence (the newest)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageRow:
    """One interval of one attempt's usage (a ``job_usage`` row)."""

    start: float
    length: float
    samples: int
    util_avg: float | None
    util_max: float | None

    def evidence(self) -> dict[str, Any]:
        return {
            "interval_start": self.start,
            "interval_s": self.length,
            "samples": self.samples,
            "gpu_util_avg": self.util_avg,
            "gpu_util_max": self.util_max,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningAttempt:
    """A running job's latest attempt, as :func:`decide` needs it."""

    job_id: str
    attempt: int
    queue: str
    type: str
    started: float
    gpus: int
    active_at: float | None = None
    """A notebook's last activity as JupyterLab reports it (``None``: not known)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """``warn`` or ``reap`` one attempt, with the ``reason`` (``idle`` or ``ttl``)
    and the evidence that justified it."""

    action: Literal["warn", "reap"]
    job_id: str
    attempt: int
    reason: Literal["idle", "ttl"]
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


def idle_run(
    rows: Sequence[UsageRow], threshold: float, *, now: float, started: float
) -> tuple[float, float, list[UsageRow]] | None:
    """``(since, idle_for, run)``: when the trailing idle run began, how long it has
    lasted, and its rows (oldest first); ``None`` without a current idle interval."""
    if not rows:
        return None
    newest = rows[-1]
    if newest.start + 2 * newest.length < now:
        return None  # stale: the sampler has not written for over an interval
    run: list[UsageRow] = []
    for row in reversed(rows):
        if row.util_max is None or row.util_max >= threshold or row.samples <= 0:
            break
        if run and row.start + row.length < run[-1].start - 1e-6:
            break  # a gap: no evidence for the time between
        run.append(row)
    if not run:
        return None
    run.reverse()
    first = run[0]
    since = max(first.start + first.length, started)
    until = min(now, newest.start + newest.length)
    return since, max(0.0, until - since), run


def decide(
    now: float,
    running: Sequence[RunningAttempt],
    policy_of: Callable[[RunningAttempt], ReapingPolicy | None],
    usage: Mapping[tuple[str, int], Sequence[UsageRow]],
    warned: Mapping[tuple[str, int], Sequence[float]],
) -> list[Decision]:
    """What to do now with each running attempt (see the module's docstring).
    ``policy_of(attempt)`` is the policy in force for its job; ``warned`` holds the times of
    the idle warnings already given to each attempt."""
    decisions: list[Decision] = []
    for job in running:
        policy = policy_of(job)
        if policy is None:
            continue
        ttl = policy.ttl(job.type)
        if ttl is not None and now - job.started >= ttl:
            decisions.append(
                Decision(
                    action="reap",
                    job_id=job.job_id,
                    attempt=job.attempt,
                    reason="ttl",
                    message=f"reclaimed: ran {format_duration(now - job.started)}, "
                    f"past the {job.type} time to live of {format_duration(ttl)}",
                    evidence={"started": job.started, "ran_s": now - job.started, "ttl_s": ttl},
                )
            )
            continue
        rule = policy.idle_rule(job.type)
        if rule is None or job.gpus <= 0:
            continue
        threshold, window, warn_before = rule
        found = idle_run(
            usage.get((job.job_id, job.attempt), ()), threshold, now=now, started=job.started
        )
        if found is None:
            continue
        since, idle_for, run = found
        began = run[0].start  # a warning given since then belongs to this idle run
        if job.active_at is not None and job.active_at > began:
            began = job.active_at  # idle only since the notebook's last use
            idle_for -= max(0.0, job.active_at - since)
            since = max(since, job.active_at)
            if idle_for <= 0:
                continue
        what = f"GPU utilisation below {threshold:g}%" + (
            " and no notebook activity" if job.active_at is not None else ""
        )
        evidence = {
            "threshold_pct": threshold,
            "window_s": window,
            "warn_before_s": warn_before,
            "idle_since": since,
            "idle_s": idle_for,
            "samples": [row.evidence() for row in run[-MAX_EVIDENCE:]],
        }
        if job.active_at is not None:
            evidence["notebook_active_at"] = job.active_at
        warnings = [at for at in warned.get((job.job_id, job.attempt), ()) if at >= began]
        if not warnings:
            if idle_for >= window - warn_before:
                left = max(0.0, window - idle_for)
                decisions.append(
                    Decision(
                        action="warn",
                        job_id=job.job_id,
                        attempt=job.attempt,
                        reason="idle",
                        message=f"idle: {what} for "
                        f"{format_duration(idle_for)}; reclaimed in "
                        f"{format_duration(max(left, warn_before))} unless it is used",
                        evidence=evidence,
                    )
                )
            continue
        if idle_for >= window and now >= min(warnings) + warn_before:
            decisions.append(
                Decision(
                    action="reap",
                    job_id=job.job_id,
                    attempt=job.attempt,
                    reason="idle",
                    message=f"reclaimed: {what} for "
                    f"{format_duration(idle_for)} (window {format_duration(window)})",
                    evidence={**evidence, "warned_at": min(warnings)},
                )
            )
    return decisions


def _policy(
    cluster: Cluster, queue_name: str, job_type: str, spec: Mapping[str, Any]
) -> ReapingPolicy | None:
    """The policy for one job: its queue's (or the nearest ancestor's), with the job's
    own notebook limits on top."""
    queue = cluster.queues.get(queue_name)
    policy = None if queue is None else queue.reaping
    own = spec.get("notebook") if job_type == "notebook" else None
    if not isinstance(own, Mapping):
        return policy
    settings = NotebookSettings.model_validate(own)
    return (policy or ReapingPolicy()).with_own(
        "notebook", ttl=settings.ttl, idle_timeout=settings.idle_timeout
    )


def _rows(rows: Sequence[Any]) -> list[UsageRow]:
    return [
        UsageRow(
            start=r.interval_start,
            length=r.interval_s,
            samples=r.samples,
            util_avg=r.gpu_util_avg,
            util_max=r.gpu_util_max,
        )
        for r in rows
    ]


def gather(
    db: DbSession,
    cluster: Cluster,
    now: float,
    activity: Callable[[str, Mapping[str, Any]], float | None] = kernel_activity,
) -> list[Decision]:
    """Read the running attempts, their usage over the longest window in force, their
    warnings, and each notebook's own activity (``activity(job_id, spec)``); return
    :func:`decide`'s answer."""
    running: list[RunningAttempt] = []
    policies: dict[str, ReapingPolicy] = {}
    horizon = 0.0
    protected = protected_replicas(db)
    for job, attempt in open_attempts(db):
        if job.state != JobState.RUNNING.value or job.id in protected:
            continue
        policy = _policy(cluster, job.queue, job.type, job.spec)
        if policy is None:
            continue
        policies[job.id] = policy
        rule = policy.idle_rule(job.type)
        if rule is not None:
            horizon = max(horizon, rule[1])
        gpus = sum(len(item.get("devices", ())) for item in attempt.allocation)
        started = attempt.start_time if attempt.start_time is not None else job.updated_at
        running.append(
            RunningAttempt(
                job_id=job.id,
                attempt=attempt.number,
                queue=job.queue,
                type=job.type,
                started=started,
                gpus=gpus,
                active_at=activity(job.id, job.spec) if job.type == NOTEBOOK and rule else None,
            )
        )
    if not running:
        return []
    keys = [(r.job_id, r.attempt) for r in running]
    usage = {
        key: _rows(rows)
        for key, rows in job_usage_rows(db, keys, since=now - 2 * horizon - 60).items()
    }
    warned: dict[tuple[str, int], list[float]] = {}
    ids = [r.job_id for r in running]
    for alert in db.scalars(select(Alert).where(Alert.kind == IDLE_WARNING, Alert.job_id.in_(ids))):
        attempt_no = alert.detail.get("attempt")
        if alert.job_id is not None and isinstance(attempt_no, int):
            warned.setdefault((alert.job_id, attempt_no), []).append(alert.at)

    return decide(now, running, lambda job: policies.get(job.job_id), usage, warned)


def apply(
    db: DbSession,
    decisions: Sequence[Decision],
    now: float,
    webhook_of: Callable[[str], str | None] = lambda tenant: None,
) -> list[Decision]:
    """Write ``decisions`` in ``db``'s transaction; return those applied (a job that
    moved on since it was read is skipped). A warning is also an ``idle_warning`` alert,
    delivered to ``webhook_of(tenant)`` when that names one."""
    done: list[Decision] = []
    for decision in decisions:
        job = get_job(db, decision.job_id, for_update=True)
        if job.state != JobState.RUNNING.value or job.attempt != decision.attempt:
            continue
        detail = {"attempt": decision.attempt, "reason": decision.reason, **decision.evidence}
        if decision.action == "warn":
            since = decision.evidence.get("idle_since", now)
            db.add(
                Event(
                    job_id=job.id,
                    at=now,
                    kind=IDLE_WARNING,
                    message=decision.message,
                    detail=detail,
                )
            )
            fire_alert(
                db,
                NewAlert(
                    kind=IDLE_WARNING,
                    dedupe_key=f"{IDLE_WARNING}:{job.id}:{decision.attempt}:{since:.3f}",
                    message=decision.message,
                    tenant=job.tenant,
                    queue=job.queue,
                    job_id=job.id,
                    detail=detail,
                    webhook=webhook_of(job.tenant),
                ),
                at=now,
            )
        else:
            transition_job(
                db,
                job.id,
                JobState.RECLAIMED,
                job=job,
                at=now,
                message=decision.message,
                detail=detail,
            )
            sync_attempt(db, job)
            audit.append_system(
                db, at=now, tenant=job.tenant, action=REAP_ACTION, object=job.id, detail=detail
            )
        db.flush()
        done.append(decision)
    return done
