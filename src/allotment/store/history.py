"""Reading recorded history for what-if replays and trace export, and the run times
start forecasts learn from.

Set-based reads, whatever the number of jobs: the jobs, their state moves (only
admissions and endings) and their attempts. Functions take a ``Session`` and never write.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, NamedTuple

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from allotment.domain.history import ConfigVersion, RecordedJob, RecordedRun, spec_seconds
from allotment.domain.lifecycle import TERMINAL, JobState
from allotment.domain.resources import GPU
from allotment.store.jobs import TRANSITION
from allotment.store.models import Attempt, ClusterConfig, Event, Job

_S = JobState
ENDINGS = frozenset({_S.SUCCEEDED, _S.FAILED, _S.PREEMPTED, _S.CANCELLED, _S.RECLAIMED})
"""The moves that end an allocation."""
_PREEMPTED = _S.PREEMPTED.value
_MOVES = tuple(s.value for s in (*ENDINGS, _S.ADMITTED, _S.PENDING))


def _in_window(since: float, until: float) -> Any:
    """Jobs submitted before ``until`` that had not ended before ``since``."""
    return and_(
        Job.submit_time < until,
        or_(Job.state.not_in([s.value for s in TERMINAL]), Job.updated_at >= since),
    )


def recorded_jobs(session: Session, *, since: float, until: float) -> list[RecordedJob]:
    """The jobs whose lives overlap ``[since, until)``, in submission order, each with
    its runs as the store saw them up to ``until`` (later moves are not yet known)."""
    where = _in_window(since, until)
    jobs = session.execute(
        select(
            Job.id,
            Job.tenant,
            Job.user,
            Job.queue,
            Job.priority_class,
            Job.type,
            Job.submit_time,
            Job.spec,
            Job.state,
        )
        .where(where)
        .order_by(Job.submit_time, Job.id)
    ).all()
    moves: dict[str, list[tuple[float, str]]] = {}
    for job_id, at, target in session.execute(
        select(Event.job_id, Event.at, Event.to_state)
        .join(Job, Job.id == Event.job_id)
        .where(where, Event.kind == TRANSITION, Event.to_state.in_(_MOVES), Event.at < until)
        .order_by(Event.id)
    ):
        moves.setdefault(job_id, []).append((at, target))
    attempts: dict[tuple[str, int], _AttemptRow] = {}
    for job_id, number, pool, failure, borrowed, ended in session.execute(
        select(
            Attempt.job_id,
            Attempt.number,
            Attempt.pool,
            Attempt.failure_class,
            Attempt.borrowed,
            Attempt.end_time,
        )
        .join(Job, Job.id == Attempt.job_id)
        .where(where)
    ):
        gpus = (borrowed or {}).get(GPU, 0)
        attempts[(job_id, number)] = _AttemptRow(
            pool, failure, int(gpus) if isinstance(gpus, int) else 0, ended
        )
    out: list[RecordedJob] = []
    for job_id, tenant, user, queue, klass, kind, submit, spec, state in jobs:
        runs, withdrawn = _runs(job_id, moves.get(job_id, ()), attempts, until)
        out.append(
            RecordedJob(
                id=job_id,
                tenant=tenant,
                queue=queue,
                priority_class=klass,
                type=kind,
                submit_time=submit,
                spec=spec,
                state=state,
                runs=runs,
                withdrawn=withdrawn,
                user=user,
            )
        )
    return out


class _AttemptRow(NamedTuple):
    pool: str | None
    failure: str | None
    borrowed: int
    ended: float | None


_NO_ROW = _AttemptRow(None, None, 0, None)


def _runs(
    job_id: str,
    moves: Iterable[tuple[float, str]],
    attempts: dict[tuple[str, int], _AttemptRow],
    until: float,
) -> tuple[tuple[RecordedRun, ...], float | None]:
    """A job's allocations from its moves in order, and when it was cancelled while
    waiting (None: it was not)."""
    runs: list[RecordedRun] = []
    opened: float | None = None
    withdrawn: float | None = None
    for at, target in moves:
        if target == _S.ADMITTED.value:
            opened, withdrawn = at, None
            continue
        if target == _S.PENDING.value:
            last = runs[-1] if runs else None
            if last is not None and last.ended_as == _PREEMPTED and last.stopped is None:
                runs[-1] = replace(last, stopped=at)
            continue
        if opened is None:
            if target == _S.CANCELLED.value:
                withdrawn = at
            continue
        row = attempts.get((job_id, len(runs) + 1), _NO_ROW)
        runs.append(
            RecordedRun(
                admitted=opened,
                released=at,
                ended_as=target,
                exited=row.ended if row.ended is not None and row.ended < until else None,
                failure_class=row.failure,
                pool=row.pool,
                borrowed_gpus=row.borrowed,
            )
        )
        opened = None
    if opened is not None:
        row = attempts.get((job_id, len(runs) + 1), _NO_ROW)
        runs.append(
            RecordedRun(
                admitted=opened,
                released=None,
                ended_as=None,
                pool=row.pool,
                borrowed_gpus=row.borrowed,
            )
        )
    return tuple(runs), withdrawn


def config_versions(session: Session, *, until: float) -> list[ConfigVersion]:
    """Every version of the cluster file applied before ``until``, oldest first."""
    rows = session.execute(
        select(ClusterConfig.version, ClusterConfig.applied_at, ClusterConfig.text)
        .where(ClusterConfig.applied_at < until)
        .order_by(ClusterConfig.version)
    ).all()
    return [ConfigVersion(version, at, text) for version, at, text in rows]


FINISHED_RUNS = 10_000
"""How many of the latest successful runs :func:`finished_runs` reads by default."""


class FinishedRun(NamedTuple):
    """A run that ended in success: its job's queue, the milli-GPUs it held, how long it
    ran, the job's declared limit (``max_runtime``, seconds) if it had one, and its
    job's user."""

    queue: str
    gpus: int
    seconds: float
    limit: float | None
    user: str


def finished_runs(session: Session, *, limit: int = FINISHED_RUNS) -> list[FinishedRun]:
    """The ``limit`` latest runs that ended in success, the oldest first: what start
    forecasts learn run times from. One read, whatever the number of jobs."""
    rows = session.execute(
        select(
            Job.queue,
            Job.user,
            Job.spec["max_runtime"],
            Attempt.start_time,
            Attempt.end_time,
            Attempt.allocation,
        )
        .join(Job, Job.id == Attempt.job_id)
        .where(
            Attempt.state == _S.SUCCEEDED.value,
            Attempt.start_time.is_not(None),
            Attempt.end_time.is_not(None),
        )
        .order_by(Attempt.end_time.desc())
        .limit(limit)
    ).all()
    return [
        FinishedRun(queue, _gpus(allocation), max(0.0, end - start), spec_seconds(declared), user)
        for queue, user, declared, start, end, allocation in reversed(rows)
    ]


def _gpus(allocation: Any) -> int:
    """The milli-GPUs a stored allocation holds, over its replicas."""
    return sum(int(item.get("resources", {}).get(GPU, 0)) for item in allocation or ())
