"""The simulated executor of a replay: it carries out what the core decides on a
simulated cluster and keeps every job's story.

It owns the healthy nodes' capacity and what is in use on them, each job's request (what
the core sees of a trace job), the runs in progress, the queue of their ends, every
attempt and every :class:`JobResult`. An admitted job runs for its true duration
(``succeeded``) or until its ``max_runtime`` stops it (``failed``, a timeout); a victim of
a preemption stops at once (its attempt ends ``preempted``) and its request is handed
back to be submitted again, with the same id and its original submit time. Jobs still
pending when the replay ends are ``unfinished``.

It checks what the core decides: an admission of a job that is not pending, a gang placed
incompletely, or a node over-committed raises :class:`ReplayError`. It never calls the
core: the driver tells the core what the executor did.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from allotment.domain.cluster import Cluster
from allotment.domain.resources import CPU, GPU, MEMORY
from allotment.scheduler.decisions import Admit
from allotment.scheduler.snapshot import PendingJob, ReplicaRequest, RunningJob
from allotment.sim.errors import ReplayError
from allotment.sim.results import (
    CANCELLED,
    FAILED,
    PREEMPTED,
    SUCCEEDED,
    UNFINISHED,
    Attempt,
    JobResult,
)
from allotment.sim.trace import TraceJob


def pending_job(
    job: TraceJob, cluster: Cluster, *, submit_time: float, oracle: bool = False
) -> PendingJob:
    """The scheduler's view of a trace job: its request and any runtime it declared,
    never its true duration (unless ``oracle``). The priority class is the trace's,
    else the queue's default."""
    requests = job.requests
    if not requests:
        resources: dict[str, int] = {}
        if job.gpus:
            resources[GPU] = job.gpus
        if job.cpu:
            resources[CPU] = job.cpu
        if job.memory:
            resources[MEMORY] = job.memory
        requests = (ReplicaRequest(name="worker", count=job.replicas, resources=resources),)
    queue = cluster.queues[job.queue]
    priority = cluster.priority_class_for(queue, job.priority_class)
    if priority is None:
        raise ReplayError(f"job {job.job_id}: no priority class allowed in queue {job.queue}")
    expected = job.expected_runtime
    if oracle:
        expected = job.duration if job.max_runtime is None else min(job.duration, job.max_runtime)
    return PendingJob(
        id=job.job_id,
        queue=job.queue,
        priority_class=priority.name,
        submit_time=submit_time,
        replicas=requests,
        pools=job.pools,
        max_runtime=job.max_runtime,
        expected_runtime=expected,
        preemptible=job.preemptible,
    )


@dataclass(frozen=True, slots=True)
class Finished:
    """A run that ended on its own (``succeeded`` or timed out), as the driver passes it
    on to the core and the forecaster."""

    job_id: str
    queue: str
    gpus: int
    """Milli-GPUs it held."""
    runtime: float
    """Replay seconds from its start to its end."""
    limit: float | None = None
    """Its declared ``max_runtime``, if it had one."""
    again: bool = False
    """The run failed and the job is retried: it waits again."""


@dataclass(slots=True)
class _Run:
    start: float
    attempt: int
    end: float
    outcome: str
    gpus: int
    nodes: tuple[tuple[str, int], ...]
    usage: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    borrowed: int = 0
    again: bool = False


class SimulatedExecutor:
    """Runs the jobs of a trace on the healthy nodes of ``cluster``.

    ``results`` holds every job's story by id, ``attempts`` every attempt as it ends,
    ``held_gpus`` the milli-GPUs held now and ``preemptions`` the preemptions carried out.
    """

    def __init__(
        self,
        cluster: Cluster,
        jobs: Sequence[TraceJob],
        *,
        time_scale: float,
        oracle: bool,
        end_latency: float = 0.0,
    ) -> None:
        self.cluster = cluster
        self.oracle = oracle
        self.end_latency = end_latency
        """Seconds from a run's last process ending to its end being due (a live loop's:
        its executor's report and the wake-up), 0 in a trace replay."""
        self.traces = {job.job_id: job for job in jobs}
        self.results = {
            job.job_id: JobResult(
                job_id=job.job_id,
                queue=job.queue,
                submit=job.submit_time * time_scale,
                duration=job.duration,
                gpus=job.total_gpus,
            )
            for job in jobs
        }
        self.nodes = {name: node for name, node in cluster.nodes.items() if node.healthy}
        self.capacity = {name: node.capacity.as_dict() for name, node in self.nodes.items()}
        self.used: dict[str, dict[str, int]] = {name: {} for name in self.nodes}
        self.requests: dict[str, PendingJob] = {}
        self.attempts: list[Attempt] = []
        self.held_gpus = 0
        self.preemptions = 0
        self._running: dict[str, _Run] = {}
        self._ends: list[tuple[float, int, str, int]] = []
        self._seq = 0

    @property
    def total_gpus(self) -> int:
        """Milli-GPUs of the healthy nodes."""
        return sum(c.get(GPU, 0) for c in self.capacity.values())

    @property
    def node_pools(self) -> dict[str, str]:
        """The pool of every healthy node."""
        return {name: node.pool for name, node in self.nodes.items()}

    def reconfigure(self, cluster: Cluster) -> None:
        """Run on ``cluster`` from now on: new healthy nodes join; a node that left (or
        fell unhealthy) goes once nothing runs on it (a replay's jobs are not moved)."""
        self.cluster = cluster
        healthy = {name: node for name, node in cluster.nodes.items() if node.healthy}
        for name, node in healthy.items():
            self.nodes[name] = node
            self.capacity[name] = node.capacity.as_dict()
            self.used.setdefault(name, {})
        for name in list(self.nodes):
            if name not in healthy and not any(self.used[name].values()):
                del self.nodes[name], self.capacity[name], self.used[name]

    def first_start(self, job_id: str) -> float | None:
        """When the job first started, None while it has not."""
        return self.results[job_id].first_start

    def arrive(self, job_id: str) -> PendingJob:
        """The request of a job that arrives now, for the core."""
        job = pending_job(
            self.traces[job_id],
            self.cluster,
            submit_time=self.results[job_id].submit,
            oracle=self.oracle,
        )
        self.requests[job_id] = job
        return job

    def next_end(self) -> float:
        """When the next run ends (a stale end included), ``inf`` when none is running."""
        return self._ends[0][0] if self._ends else math.inf

    def end_due(self, now: float) -> list[Finished]:
        """End every run due by ``now``: the runs that ended, in order of their ends."""
        ends = self._ends
        finished: list[Finished] = []
        while ends and ends[0][0] <= now:
            _, _, job_id, attempt = heapq.heappop(ends)
            run = self._running.get(job_id)
            if run is None or run.attempt != attempt:
                continue  # an attempt since preempted
            del self._running[job_id]
            self._release(run)
            self._record(job_id, run, now, run.outcome)
            result = self.results[job_id]
            if not run.again:
                result.end = now
                result.outcome = run.outcome
            limit = self.traces[job_id].max_runtime
            finished.append(
                Finished(job_id, result.queue, run.gpus, now - run.start, limit, run.again)
            )
        return finished

    def withdraw(self, job_id: str, now: float) -> bool | None:
        """Its user cancels job ``job_id`` at ``now``: True if it was running (it stops),
        False if it was waiting (it leaves), None if it had ended or never arrived."""
        result = self.results[job_id]
        if job_id not in self.requests or result.outcome != UNFINISHED:
            return None
        result.outcome = CANCELLED
        result.end = now
        run = self._running.pop(job_id, None)
        if run is None:
            return False
        self._release(run)
        self._record(job_id, run, now, CANCELLED)
        return True

    def start(self, admit: Admit, now: float, allocation: RunningJob | None) -> None:
        """Start an admitted job on its placements; ``allocation`` is the core's record of
        it (its start time)."""
        job = self.requests.get(admit.job)
        if job is None or admit.job in self._running:
            state = "running" if admit.job in self._running else "not pending"
            raise ReplayError(f"the scheduler admitted job {admit.job}, which is {state}")
        if allocation is None:
            raise ReplayError(f"the core holds no allocation for admitted job {admit.job}")
        if len(admit.placements) != job.replica_count:
            raise ReplayError(
                f"the scheduler placed {len(admit.placements)} of job {admit.job}'s "
                f"{job.replica_count} replicas; gangs start whole"
            )
        usage: list[tuple[str, dict[str, int]]] = []
        per_node: dict[str, int] = {}
        for placement in admit.placements:
            node = placement.node
            capacity = self.capacity.get(node)
            if capacity is None:
                raise ReplayError(f"job {admit.job} placed on unknown or unhealthy node {node}")
            used = self.used[node]
            for key, amount in placement.resources.items():
                total = used.get(key, 0) + amount
                if total > capacity.get(key, 0):
                    raise ReplayError(
                        f"job {admit.job} over-commits {key} on node {node} at t={now:g}: "
                        f"{total} of {capacity.get(key, 0)} milli-units"
                    )
                used[key] = total
            self.held_gpus += placement.resources.get(GPU, 0)
            usage.append((node, dict(placement.resources)))
            per_node[node] = per_node.get(node, 0) + placement.resources.get(GPU, 0)
        trace = self.traces[admit.job]
        result = self.results[admit.job]
        result.attempts += 1
        if result.first_start is None:
            result.first_start = now
        runtime, outcome, again = trace.duration, SUCCEEDED, False
        if trace.runs:
            done = result.attempts - 1 - result.preempted
            runtime, outcome = trace.runs[min(done, len(trace.runs) - 1)]
            again = done < len(trace.runs) - 1
        elif trace.max_runtime is not None and trace.duration > trace.max_runtime:
            runtime, outcome = trace.max_runtime, FAILED
        # The scheduler saw an expected runtime only under an oracle policy.
        self._running[job.id] = _Run(
            start=allocation.start_time,
            attempt=result.attempts,
            end=now + runtime,
            outcome=outcome,
            gpus=sum(per_node.values()),
            nodes=tuple(per_node.items()),
            usage=usage,
            borrowed=admit.borrowed.get(GPU, 0),
            again=again,
        )
        self._seq += 1
        end = now + runtime + self.end_latency
        heapq.heappush(self._ends, (end, self._seq, job.id, result.attempts))

    def preempt(self, job_id: str, now: float) -> PendingJob | None:
        """Stop a running job at ``now``: its request, to submit again (None: it was not
        running)."""
        run = self._running.pop(job_id, None)
        if run is None:
            return None
        self._release(run)
        self._record(job_id, run, now, PREEMPTED)
        self.results[job_id].preempted += 1
        self.preemptions += 1
        return self.requests[job_id]

    def close(self) -> None:
        """At the end of the replay: record the jobs that never ran to an end as
        ``unfinished``, and the runs still going (a replay stopped at a time) as
        attempts with no end."""
        for job_id in list(self.requests):
            run = self._running.get(job_id)
            if run is not None:
                self.attempts.append(
                    Attempt(
                        job_id=job_id,
                        queue=self.results[job_id].queue,
                        attempt=run.attempt,
                        submit=self.results[job_id].submit,
                        start=run.start,
                        end=None,
                        gpus=run.gpus,
                        nodes=run.nodes,
                        outcome=UNFINISHED,
                        borrowed=run.borrowed,
                    )
                )
            elif self.results[job_id].outcome == UNFINISHED:
                self._unfinished(job_id)

    def _release(self, run: _Run) -> None:
        for node, resources in run.usage:
            used = self.used[node]
            for key, amount in resources.items():
                used[key] -= amount
            self.held_gpus -= resources.get(GPU, 0)

    def _record(self, job_id: str, run: _Run, end: float, outcome: str) -> None:
        result = self.results[job_id]
        start = run.start
        result.gpu_seconds += run.gpus * (end - start)
        if outcome == PREEMPTED:
            result.lost_gpu_seconds += run.gpus * (end - start)
        self.attempts.append(
            Attempt(
                job_id=job_id,
                queue=result.queue,
                attempt=run.attempt,
                submit=result.submit,
                start=start,
                end=end,
                gpus=run.gpus,
                nodes=run.nodes,
                outcome=outcome,
                borrowed=run.borrowed,
            )
        )

    def _unfinished(self, job_id: str) -> None:
        result = self.results[job_id]
        request = self.requests[job_id]
        self.attempts.append(
            Attempt(
                job_id=job_id,
                queue=result.queue,
                attempt=result.attempts + 1,
                submit=result.submit,
                start=None,
                end=None,
                gpus=request.gpus,
                nodes=(),
                outcome=UNFINISHED,
            )
        )
        result.outcome = UNFINISHED
        result.end = None
