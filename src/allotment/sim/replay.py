"""Trace replay: the real scheduler on a virtual clock with a simulated executor.

Events are arrivals (``submit_time x time_scale``) and completions. Whenever the state
changed at an instant ``t`` -- all events at ``t`` applied first -- the driver runs a
scheduling cycle at ``now=t`` and applies its decisions:

- ``Admit``: the job starts at ``t`` on the given placements and ends at ``t + duration``
  (``succeeded``), or is stopped at its ``max_runtime`` (``failed``, a timeout).
- ``Preempt``: each victim stops at ``t`` (its attempt ends ``preempted``) and goes back
  to pending with the same id and its original submit time; the preemptor stays pending,
  nominated (``preempting`` its victims), and the next cycle tries it first.

Cycles at one instant repeat while a cycle preempted (the freed room goes to the
preemptor) or stopped short at a per-cycle bound (a scheduler function: while it
changes anything), at most ``max_cycles_per_instant`` times. The real core runs as a
:class:`~allotment.scheduler.session.Session`, which keeps free capacity, quota usage and
each queue's order between cycles (the same decisions as ``schedule_once`` on the
equivalent snapshot, at a fraction of the cost); a scheduler given as a function of a
snapshot (tests, experiments) is called with whole snapshots.
The scheduler never sees a true duration: pending jobs
carry ``expected_runtime=None`` and running ones ``expected_end=None``, unless the policy
is an ``oracle``. The replay ends after the last event; jobs still pending then are
``unfinished``.

The simulated executor checks what the core decides: an admission of a job that is not
pending, a gang placed incompletely, or a node over-committed raises :class:`ReplayError`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from allotment.domain.cluster import Cluster
from allotment.domain.errors import AllotmentError
from allotment.domain.resources import CPU, GPU, MEMORY
from allotment.scheduler.decisions import Admit, Decisions
from allotment.scheduler.forecast import RuntimeHistory, forecast_start
from allotment.scheduler.session import Session, carry_nominations, victims_gone
from allotment.scheduler.snapshot import (
    PendingJob,
    ReplicaRequest,
    RunningJob,
    SchedulerPolicy,
    Snapshot,
)
from allotment.sim.results import (
    FAILED,
    PREEMPTED,
    SUCCEEDED,
    UNFINISHED,
    Attempt,
    JobResult,
    ReplayResult,
    Shortfall,
)
from allotment.sim.trace import TraceJob

Scheduler = Callable[[Snapshot], Decisions]
"""A function from a snapshot to decisions, e.g. ``schedule_once``."""


class ReplayError(AllotmentError):
    """The scheduler decided something the simulated cluster cannot do (a core bug), or
    the scheduler is not available."""

    code = "replay_error"


def default_scheduler() -> Scheduler | None:
    """None: the real core, run incrementally as a :class:`Session`."""
    return None


class _SnapshotCore:
    """A :class:`Session`-shaped adapter around a snapshot function: the whole pending
    and running sets are handed to ``schedule`` every cycle."""

    def __init__(self, cluster: Cluster, policy: SchedulerPolicy, schedule: Scheduler) -> None:
        self.cluster = cluster
        self.policy = policy
        self.schedule = schedule
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    def submit(self, job: PendingJob) -> None:
        self.pending[job.id] = job

    def update(self, job: PendingJob) -> None:
        self.pending[job.id] = job

    def pending_job(self, job_id: str) -> PendingJob | None:
        return self.pending.get(job_id)

    def gone(self, job_id: str) -> RunningJob | None:
        return self.running.pop(job_id, None)

    def cycle(self, now: float, *, explain: bool = True) -> Decisions:
        preemptors = (j for j in self.pending.values() if j.preempting)
        had_turn = victims_gone(preemptors, self.running)
        decisions = self.schedule(
            Snapshot(
                now=now,
                cluster=self.cluster,
                pending=list(self.pending.values()),
                running=list(self.running.values()),
                policy=self.policy,
            )
        )
        for admit in decisions.admitted:
            job = self.pending.pop(admit.job, None)
            if job is None:
                state = "running" if admit.job in self.running else "not pending"
                raise ReplayError(f"the scheduler admitted job {admit.job}, which is {state}")
            self.running[job.id] = admit.running(job, at=now)
        carry_nominations(decisions, had_turn, self.pending_job, self.update)
        return decisions


@dataclass(slots=True)
class _Run:
    running: RunningJob
    attempt: int
    end: float
    outcome: str
    gpus: int
    nodes: tuple[tuple[str, int], ...]
    usage: list[tuple[str, dict[str, int]]] = field(default_factory=list)


def pending_job(
    job: TraceJob, cluster: Cluster, *, submit_time: float, oracle: bool = False
) -> PendingJob:
    """The scheduler's view of a trace job: its request, never its true duration (unless
    ``oracle``). The priority class is the trace's, else the queue's default."""
    resources: dict[str, int] = {}
    if job.gpus:
        resources[GPU] = job.gpus
    if job.cpu:
        resources[CPU] = job.cpu
    if job.memory:
        resources[MEMORY] = job.memory
    queue = cluster.queues[job.queue]
    priority = cluster.priority_class_for(queue, job.priority_class)
    if priority is None:
        raise ReplayError(f"job {job.job_id}: no priority class allowed in queue {job.queue}")
    expected = None
    if oracle:
        expected = job.duration if job.max_runtime is None else min(job.duration, job.max_runtime)
    return PendingJob(
        id=job.job_id,
        queue=job.queue,
        priority_class=priority.name,
        submit_time=submit_time,
        replicas=(ReplicaRequest(name="worker", count=job.replicas, resources=resources),),
        pools=job.pools,
        max_runtime=job.max_runtime,
        expected_runtime=expected,
    )


class Replay:
    """One replay of ``jobs`` on ``cluster`` under ``policy``; call :meth:`run` once.

    ``scheduler`` defaults to the real core. Blocks for the whole replay; raises
    :class:`ReplayError` when the core's decisions cannot be carried out.
    """

    def __init__(
        self,
        cluster: Cluster,
        jobs: Sequence[TraceJob],
        policy: SchedulerPolicy,
        *,
        time_scale: float = 1.0,
        scheduler: Scheduler | None = None,
        max_cycles_per_instant: int = 64,
        predict_every: int = 0,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if not (time_scale >= 0 and math.isfinite(time_scale)):
            raise ReplayError(f"time scale must be a finite number >= 0, got {time_scale}")
        self.cluster = cluster
        self.policy = policy
        self.time_scale = time_scale
        self.scheduler = scheduler
        self.max_cycles_per_instant = max(1, max_cycles_per_instant)
        self.predict_every = max(0, predict_every)
        self.progress = progress
        self.history = RuntimeHistory()
        self._to_predict: list[str] = []
        self._arrived = 0
        self.forecast_s = 0.0
        self.traces = {job.job_id: job for job in jobs}
        self.arrivals = sorted(
            ((job.submit_time * time_scale, i, job.job_id) for i, job in enumerate(jobs)),
        )
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
        self.running: dict[str, _Run] = {}
        self.attempts: list[Attempt] = []
        self.completions: list[tuple[float, int, str, int]] = []
        self.wakeups: list[float] = []
        self._wakeup_set: set[float] = set()
        self.shortfalls: list[Shortfall] = []
        self.held_gpus = 0
        self.waiting_s = 0.0
        self.held_while_waiting = 0.0
        self.unusable_while_waiting = 0.0
        self._sampled_at = 0.0
        self._waiting_state: tuple[int, int] | None = None
        self._fragment_at = -math.inf
        span = (self.arrivals[-1][0] - self.arrivals[0][0]) if self.arrivals else 0.0
        self._fragment_every = max(1.0, span / 2_000)
        self._owed: dict[str, float] = {}
        self._last_instant = 0.0
        schedule = scheduler if scheduler is not None else default_scheduler()
        self.core: Session | _SnapshotCore = (
            Session(cluster, policy)
            if schedule is None
            else _SnapshotCore(cluster, policy, schedule)
        )
        self._seq = 0
        self.cycles = 0
        self.preemptions = 0
        self.scheduler_s = 0.0

    # -- driver ---------------------------------------------------------------------

    def run(self) -> ReplayResult:
        started = time.perf_counter()
        core = self.core
        arrivals = self.arrivals
        index = 0
        while True:
            now = math.inf
            if index < len(arrivals):
                now = arrivals[index][0]
            if self.completions and self.completions[0][0] < now:
                now = self.completions[0][0]
            if self.wakeups and self.wakeups[0] < now:
                now = self.wakeups[0]
            if now == math.inf:
                break
            changed = False
            while index < len(arrivals) and arrivals[index][0] <= now:
                self._arrive(arrivals[index][2], now)
                index += 1
                if self.progress is not None and index % 1000 == 0:
                    self.progress(index, len(arrivals))
                changed = True
            while self.completions and self.completions[0][0] <= now:
                _, _, job_id, attempt = heapq.heappop(self.completions)
                changed = self._complete(job_id, attempt, now) or changed
            while self.wakeups and self.wakeups[0] <= now:
                self._wakeup_set.discard(heapq.heappop(self.wakeups))
                changed = True
            if changed and core.pending_count:
                self._settle(now)
            if changed:
                self._sample(now)
            if self._to_predict:
                self._predict(now)
            if changed:
                self._track_shortfalls(now)
        self._track_shortfalls(math.inf, last=True)
        for job_id in list(self.requests):
            if job_id not in self.running and self.results[job_id].outcome == UNFINISHED:
                self._unfinished(job_id)
        jobs = [self.results[job_id] for _, _, job_id in sorted(arrivals, key=lambda a: a[1])]
        return ReplayResult(
            policy=self.policy,
            jobs=jobs,
            attempts=self.attempts,
            total_gpus=sum(c.get(GPU, 0) for c in self.capacity.values()),
            cycles=self.cycles,
            preemptions=self.preemptions,
            shortfalls=self.shortfalls if isinstance(core, Session) else None,
            scheduler_s=self.scheduler_s,
            forecast_s=self.forecast_s,
            waiting_s=self.waiting_s,
            node_pools={name: node.pool for name, node in self.nodes.items()},
            held_while_waiting=self.held_while_waiting,
            unusable_while_waiting=self.unusable_while_waiting,
            wall_s=time.perf_counter() - started,
        )

    def _settle(self, now: float) -> None:
        core = self.core
        for _ in range(self.max_cycles_per_instant):
            began = time.perf_counter()
            decisions = core.cycle(now, explain=False)
            self.scheduler_s += time.perf_counter() - began
            self.cycles += 1
            # As in the live system, the core nominates each preemptor: the next cycle
            # tries it before anyone else, on the capacity its victims freed.
            preempted = False
            for preempt in decisions.preemptions:
                for victim in preempt.victims:
                    preempted = self._preempt(victim.job, now) or preempted
            for admit in decisions.admitted:
                self._start(admit, now)
            if decisions.next_wakeup is not None:
                self._wake_at(decisions.next_wakeup)
            # The real core admits everything it can in one cycle; it may do more at the
            # same instant only after a preemption or when it stopped at a bound. A
            # scheduler function is asked again while it admits anything.
            again = (
                preempted
                or bool(decisions.stats.get("truncated"))
                or (isinstance(core, _SnapshotCore) and bool(decisions.admitted))
            )
            if not again or not core.pending_count:
                break

    def _sample(self, now: float) -> None:
        """Close the interval since the last instant (time-weighted: GPUs held and free
        GPUs no waiting job could use, while jobs wait) and measure the new state."""
        span = now - self._sampled_at
        if span > 0 and self._waiting_state is not None:
            held, unusable = self._waiting_state
            self.waiting_s += span
            self.held_while_waiting += held * span
            self.unusable_while_waiting += unusable * span
        self._sampled_at = now
        core = self.core
        if not isinstance(core, Session) or not core.pending_count:
            self._waiting_state = None
            return
        known = self._waiting_state[1] if self._waiting_state is not None else None
        if known is not None and now - self._fragment_at < self._fragment_every:
            unusable = known
        else:
            # Looking at every node is costly: about 2,000 times over the replay.
            self._fragment_at = now
            shapes = core.waiting_shapes(per_queue=16)
            unusable = 0
            for node in core.state.placer.nodes.values():
                free = node.free.get(GPU, 0)
                if free > 0 and not any(node.fits(shape) for shape in shapes):
                    unusable += free
        self._waiting_state = (self.held_gpus, unusable)

    def _track_shortfalls(self, now: float, *, last: bool = False) -> None:
        """Open and close the queues' guarantee shortfalls after the cycles at ``now``."""
        core = self.core
        if not isinstance(core, Session):
            return
        short = set() if last or not core.pending_count else set(core.short_of_guarantee())
        owed = self._owed
        for queue in short - owed.keys():
            owed[queue] = now
        for queue in list(owed.keys() - short):
            start = owed.pop(queue)
            end = self._last_instant if last else now
            self.shortfalls.append(Shortfall(queue=queue, start=start, end=end))
        self._last_instant = now

    def _wake_at(self, at: float) -> None:
        """Jobs held back by time alone (a time window) need a cycle when it opens: no
        event says so."""
        if at not in self._wakeup_set:
            self._wakeup_set.add(at)
            heapq.heappush(self.wakeups, at)

    # -- the simulated executor -------------------------------------------------------

    def _predict(self, now: float) -> None:
        """Forecast, after the cycles at ``now``, when each sampled job that arrived at
        ``now`` will start: at once if it already has, else as the session foresees it
        with run times learned from the jobs finished so far."""
        began = time.perf_counter()
        core = self.core
        for job_id in self._to_predict:
            result = self.results[job_id]
            result.sampled = True
            if result.first_start is not None:
                result.predicted_start = result.first_start
            elif isinstance(core, Session):
                result.predicted_start = forecast_start(core, job_id, self.history, now=now)
        self._to_predict.clear()
        self.forecast_s += time.perf_counter() - began

    def _arrive(self, job_id: str, now: float) -> None:
        self._arrived += 1
        if self.predict_every and self._arrived % self.predict_every == 0:
            self._to_predict.append(job_id)
        trace = self.traces[job_id]
        job = pending_job(
            trace,
            self.cluster,
            submit_time=self.results[job_id].submit,
            oracle=self.policy.oracle,
        )
        self.requests[job_id] = job
        self.core.submit(job)

    def _start(self, admit: Admit, now: float) -> None:
        job = self.requests.get(admit.job)
        if job is None or admit.job in self.running:
            state = "running" if admit.job in self.running else "not pending"
            raise ReplayError(f"the scheduler admitted job {admit.job}, which is {state}")
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
        runtime, outcome = trace.duration, SUCCEEDED
        if trace.max_runtime is not None and trace.duration > trace.max_runtime:
            runtime, outcome = trace.max_runtime, FAILED
        # The scheduler saw an expected runtime only under an oracle policy.
        running = self.core.running[job.id]
        self.running[job.id] = _Run(
            running=running,
            attempt=result.attempts,
            end=now + runtime,
            outcome=outcome,
            gpus=sum(per_node.values()),
            nodes=tuple(per_node.items()),
            usage=usage,
        )
        self._seq += 1
        heapq.heappush(self.completions, (now + runtime, self._seq, job.id, result.attempts))

    def _release(self, run: _Run) -> None:
        for node, resources in run.usage:
            used = self.used[node]
            for key, amount in resources.items():
                used[key] -= amount
            self.held_gpus -= resources.get(GPU, 0)

    def _record(self, job_id: str, run: _Run, end: float, outcome: str) -> None:
        result = self.results[job_id]
        start = run.running.start_time
        result.gpu_seconds += run.gpus * (end - start)
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
            )
        )

    def _complete(self, job_id: str, attempt: int, now: float) -> bool:
        run = self.running.get(job_id)
        if run is None or run.attempt != attempt:
            return False
        del self.running[job_id]
        self.core.gone(job_id)
        self._release(run)
        self._record(job_id, run, now, run.outcome)
        result = self.results[job_id]
        result.end = now
        result.outcome = run.outcome
        self.history.record(result.queue, run.gpus, now - run.running.start_time)
        return True

    def _preempt(self, job_id: str, now: float) -> bool:
        run = self.running.pop(job_id, None)
        if run is None:
            return False
        self.core.gone(job_id)
        self._release(run)
        self._record(job_id, run, now, PREEMPTED)
        result = self.results[job_id]
        result.preempted += 1
        self.preemptions += 1
        self.core.submit(self.requests[job_id])
        return True

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


def replay(
    cluster: Cluster,
    jobs: Sequence[TraceJob],
    policy: SchedulerPolicy,
    *,
    time_scale: float = 1.0,
    scheduler: Scheduler | None = None,
) -> ReplayResult:
    """Replay ``jobs`` on ``cluster`` under ``policy`` (see :class:`Replay`)."""
    return Replay(cluster, jobs, policy, time_scale=time_scale, scheduler=scheduler).run()
