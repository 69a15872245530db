"""Recorded history as a replayable trace, and as the generic trace CSV.

A recorded job becomes a :class:`~allotment.sim.trace.TraceJob` on the real clock (its
submit time in seconds since the epoch), with the replica groups, pools, priority class
and declared runtimes it was submitted with, and its *runs*: how long each allocation
held its resources and how it ended. What the replay assumes where the recording is
silent:

- an allocation that ended ``preempted`` is left out: the replay makes its own
  preemptions, and a preempted job's work starts again;
- a run that ended ``failed`` and was followed by another is retried at once (the live
  back-off is not replayed);
- a run still holding its resources at the window's end holds them to the end;
- a job that never completed a run in the window (still waiting, or only preempted)
  runs as long as it declared (``expected_runtime``), else the median run of its queue
  in the window, else of all queues; each such job is counted as estimated;
- a job cancelled while it waited leaves the line at the same instant; if the replay
  started it before then, it is stopped then.

The live loop itself leaves two traces in the recording that a faithful replay repeats
(:class:`HistoryTrace`): its *turn* (an end is seen, and the resources freed, at the
loop's next turn: estimated as twice the median time from a run's processes ending to
its release, and each run then lasts until its processes ended) and the time a
preempted run takes to stop (the median from the preemption to the job being back in
line), during which the victim still holds its resources.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allotment.domain.history import RecordedJob, RecordedRun, spec_seconds
from allotment.domain.job import JobType, ReplicaGroup
from allotment.domain.lifecycle import JobState
from allotment.domain.resources import CPU, GPU, MEMORY, format_quantity
from allotment.scheduler.snapshot import ReplicaRequest
from allotment.sim.results import CANCELLED, FAILED, RECLAIMED, SUCCEEDED, UNFINISHED
from allotment.sim.trace import KNOWN_COLUMNS, TraceJob

_ENDINGS = {
    JobState.SUCCEEDED.value: SUCCEEDED,
    JobState.FAILED.value: FAILED,
    JobState.CANCELLED.value: CANCELLED,
    JobState.RECLAIMED.value: RECLAIMED,
}
_PREEMPTED = JobState.PREEMPTED.value


@dataclass(slots=True)
class HistoryTrace:
    """The replayable jobs of a recording and what had to be assumed."""

    jobs: list[TraceJob]
    estimated: int = 0
    """Jobs whose run time was estimated (they never completed a run)."""
    open_runs: int = 0
    """Jobs still holding resources at the window's end."""
    withdrawn: int = 0
    """Jobs cancelled while they waited."""
    medians: dict[str, float] = field(default_factory=dict)
    """The median recorded run per queue, used for the estimates."""
    stop_latency: float = 0.0
    """The median time a preempted run took to stop (0 when none was preempted)."""
    end_latency: float = 0.0
    """How long after a run's last process ended the live loop saw the end and freed its
    resources, the recording's median (0: not known)."""
    turn: float = 0.0
    """The live loop's turn, as the recording shows it: twice ``end_latency`` (an end
    comes, on average, half-way through a turn that is under way)."""


def kept_runs(runs: Iterable[RecordedRun]) -> list[RecordedRun]:
    """The runs a replay repeats: every run but the preempted ones."""
    return [run for run in runs if run.ended_as != _PREEMPTED]


def _medians(recorded: Sequence[RecordedJob]) -> tuple[dict[str, float], float | None]:
    per_queue: dict[str, list[float]] = {}
    for job in recorded:
        for run in kept_runs(job.runs):
            if run.released is not None:
                per_queue.setdefault(job.queue, []).append(run.released - run.admitted)
    medians = {queue: statistics.median(values) for queue, values in per_queue.items()}
    every = [v for values in per_queue.values() for v in values]
    return medians, (statistics.median(every) if every else None)


def _seen_after(run: RecordedRun) -> float | None:
    """How long after its processes ended the run's end was seen and its resources
    freed (None: not known)."""
    if run.exited is None or run.released is None:
        return None
    if not run.admitted <= run.exited <= run.released:
        return None
    return run.released - run.exited


class _Requests:
    """Replica groups of specs, parsed once per distinct form."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[ReplicaRequest, ...]] = {}

    def __call__(self, spec: Mapping[str, Any]) -> tuple[ReplicaRequest, ...]:
        groups = spec.get("replicas") or []
        key = json.dumps(groups, sort_keys=True)
        known = self._seen.get(key)
        if known is None:
            parsed = [ReplicaGroup.model_validate(g) for g in groups]
            known = self._seen[key] = tuple(
                ReplicaRequest(name=g.name, count=g.count, resources=g.resources.as_dict())
                for g in parsed
            )
        return known


def replay_jobs(recorded: Sequence[RecordedJob]) -> HistoryTrace:
    """The recorded jobs as a trace for :class:`~allotment.sim.replay.Replay` (time scale
    1, real clock), in submission order."""
    medians, overall = _medians(recorded)
    requests = _Requests()
    stops = [
        run.stopped - run.released
        for job in recorded
        for run in job.runs
        if run.ended_as == _PREEMPTED and run.stopped is not None and run.released is not None
    ]
    seen = [
        delay
        for job in recorded
        for run in kept_runs(job.runs)
        if (delay := _seen_after(run)) is not None
    ]
    latency = statistics.median(seen) if seen else 0.0
    out = HistoryTrace(
        jobs=[],
        medians=medians,
        stop_latency=statistics.median(stops) if stops else 0.0,
        end_latency=latency,
        turn=2 * latency,
    )
    for job in recorded:
        spec = job.spec
        expected = spec_seconds(spec.get("expected_runtime"))
        runs: list[tuple[float, str]] = []
        for run in kept_runs(job.runs):
            ending = _ENDINGS.get(run.ended_as or "", FAILED)
            if run.released is None:
                runs.append((math.inf, UNFINISHED))
            elif out.end_latency and run.exited is not None and _seen_after(run) is not None:
                runs.append((run.exited - run.admitted, ending))
            else:
                runs.append((run.released - run.admitted, ending))
        if runs and runs[-1][0] == math.inf:
            out.open_runs += 1
        if not runs or (runs[-1][1] == FAILED and job.state == JobState.PENDING.value):
            # It has no completed run to repeat (or waits for a retry): estimate one.
            guess = expected or medians.get(job.queue) or overall
            if job.withdrawn is None:
                out.estimated += 1
            runs.append((math.inf if guess is None else guess, SUCCEEDED))
        if job.withdrawn is not None:
            out.withdrawn += 1
        groups = requests(spec)
        first = groups[0] if groups else ReplicaRequest()
        pools = tuple(str(p) for p in spec.get("pools") or ())
        out.jobs.append(
            TraceJob(
                job_id=job.id,
                submit_time=job.submit_time,
                duration=runs[-1][0] if math.isfinite(runs[-1][0]) else 0.0,
                queue=job.queue,
                gpus=first.resources.get(GPU, 0),
                replicas=first.count,
                pools=pools if len(pools) != 1 else (),
                pool=pools[0] if len(pools) == 1 else None,
                priority_class=job.priority_class,
                type=_type(job.type),
                max_runtime=spec_seconds(spec.get("max_runtime")),
                requests=groups,
                expected_runtime=expected,
                preemptible=bool(spec.get("preemptible")),
                runs=tuple(runs),
                withdraw_at=job.withdrawn,
            )
        )
    return out


def _type(value: str) -> JobType:
    try:
        return JobType(value)
    except ValueError:
        return JobType.TRAINING


def trace_csv(
    recorded: Sequence[RecordedJob], *, since: float, users: bool = False
) -> tuple[str, int]:
    """The generic trace CSV of the recorded jobs that completed a run in the window,
    without names, commands or users: ids ``h1, h2, ...`` in submission order, submit
    times in seconds from ``since``, ``duration`` the last run's. A job of several
    replica groups is written as its largest group (the format has one). With
    ``users``, a ``user`` column tells whose jobs are the same person's, never who:
    ``u1, u2, ...`` in order of each user's first job written. Returns the text and the
    number of jobs left out because they never completed a run."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(c for c in KNOWN_COLUMNS if users or c != "user")
    pseudonyms: dict[str, str] = {}
    requests = _Requests()
    left_out = written = 0
    for job in recorded:
        runs = [r for r in kept_runs(job.runs) if r.released is not None]
        if not runs or job.submit_time < since:
            left_out += not runs and job.submit_time >= since
            continue
        last = runs[-1]
        assert last.released is not None
        groups = requests(job.spec)
        group = max(groups, key=lambda g: (g.count * g.resources.get(GPU, 0), g.count))
        res = group.resources
        pools = [str(p) for p in job.spec.get("pools") or ()]
        limit = spec_seconds(job.spec.get("max_runtime"))
        written += 1
        user: tuple[str, ...] = ()
        if users:
            user = (pseudonyms.setdefault(job.user, f"u{len(pseudonyms) + 1}"),)
        writer.writerow(
            (
                f"h{written}",
                _number(job.submit_time - since),
                _number(last.released - last.admitted),
                job.queue,
                format_quantity(GPU, res.get(GPU, 0)),
                group.count,
                format_quantity(CPU, res[CPU]) if CPU in res else "",
                format_quantity(MEMORY, res[MEMORY]) if MEMORY in res else "",
                pools[0] if len(pools) == 1 else "",
                job.priority_class,
                _type(job.type).value,
                "" if limit is None else _number(limit),
                *user,
            )
        )
    return out.getvalue(), left_out


def _number(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".")
