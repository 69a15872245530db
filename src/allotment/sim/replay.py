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
changes anything), as the live loop runs cycle after cycle: a chain of reclaims (each
victim, requeued, takes its own pool back from a borrower there) plays out in full at
its instant. ``max_cycles_per_instant`` (:data:`MAX_CYCLES_PER_INSTANT`) only guards
against a livelock; an instant it cuts short is counted (``instants_cut``), since what
follows it is then not what the live system would do. The real core runs as a
:class:`~allotment.scheduler.session.Session`, which keeps free capacity, quota usage and
each queue's order between cycles (the same decisions as ``schedule_once`` on the
equivalent snapshot, at a fraction of the cost); a scheduler given as a function of a
snapshot (tests, experiments) is called with whole snapshots.
The scheduler never sees a true duration: pending jobs
carry ``expected_runtime=None`` and running ones ``expected_end=None``, unless the policy
is an ``oracle``. The replay ends after the last event; jobs still pending then are
``unfinished``.

For a recorded history (``allot whatif``) the driver also stops at ``until`` (runs
still going then stay open), applies configuration ``changes`` at their instants (the
core carries on under the new cluster with what it holds), withdraws jobs cancelled
while they waited (``TraceJob.withdraw_at``), retries failed runs (``TraceJob.runs``),
lets a victim hold its resources for ``stop_latency`` seconds after its preemption (the
core sees it stopping, as the live loop's does), sees a run's end ``end_latency``
seconds after it (the executor's report), and takes its turns as the live loop does
(``turn``): one when something happens, but not sooner than ``turn`` seconds after the
last, so that what happens in between (submissions, ends) is seen, and ordered, together
at that turn.

The driver owns the clock, the events and the cycles, and composes parts of one concern
each, passing each what it needs:

- :class:`~allotment.sim.executor.SimulatedExecutor` carries out the decisions on the
  simulated cluster (runs, attempts, every job's story) and checks them: an admission of
  a job that is not pending, a gang placed incompletely, or a node over-committed raises
  :class:`ReplayError`;
- :class:`~allotment.sim.sampler.ContentionSampler` measures how the GPUs were used while
  jobs waited;
- :class:`~allotment.sim.shortfalls.ShortfallTracker` records the queues' guarantee
  shortfalls;
- :class:`~allotment.sim.forecasting.StartForecaster` forecasts the starts of sampled jobs;
- :class:`~allotment.sim.snapshot_core.SnapshotCore` runs a scheduler given as a snapshot
  function in place of the session.

Only the driver changes the core: it submits the executor's requests and tells the core
which jobs are gone. The sampler, the tracker and the forecaster only read the session
the driver hands them (nothing when the core is a snapshot function).
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from allotment.domain.cluster import Cluster
from allotment.domain.resources import GPU
from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import SchedulerPolicy
from allotment.sim.errors import ReplayError
from allotment.sim.executor import SimulatedExecutor, pending_job
from allotment.sim.forecasting import StartForecaster
from allotment.sim.results import ReplayResult
from allotment.sim.sampler import ContentionSampler
from allotment.sim.shortfalls import ShortfallTracker
from allotment.sim.snapshot_core import Scheduler, SnapshotCore
from allotment.sim.trace import TraceJob

__all__ = [
    "Replay",
    "ReplayError",
    "Scheduler",
    "default_scheduler",
    "pending_job",
    "replay",
]

MAX_CYCLES_PER_INSTANT = 4096
"""Cycles at one instant before the replay moves on regardless: a guard against a
livelock, far above the longest chain of reclaims seen (147 cycles in the Philly window
at 4x). It once was 64, which cut such chains short: the queues they left short of their
guarantee stayed short until the next event."""

YOUNG_COLLECTION_EVERY = 100_000
"""Allocations between two young garbage collections during a replay (Python's default
is 700)."""


def default_scheduler() -> Scheduler | None:
    """None: the real core, run incrementally as a :class:`Session`."""
    return None


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
        max_cycles_per_instant: int = MAX_CYCLES_PER_INSTANT,
        predict_every: int = 0,
        progress: Callable[[int, int], None] | None = None,
        until: float | None = None,
        changes: Sequence[tuple[float, Cluster]] = (),
        stop_latency: float = 0.0,
        end_latency: float = 0.0,
        turn: float = 0.0,
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
        self.arrivals = sorted(
            ((job.submit_time * time_scale, i, job.job_id) for i, job in enumerate(jobs)),
        )
        self.wakeups: list[float] = []
        self._wakeup_set: set[float] = set()
        self.until = math.inf if until is None else until
        self.withdrawals = sorted(
            (job.withdraw_at * time_scale, job.job_id)
            for job in jobs
            if job.withdraw_at is not None
        )
        self.changes = sorted(changes, key=lambda change: change[0])
        self.stop_latency = max(0.0, stop_latency)
        self.stops: list[tuple[float, str]] = []
        span = (self.arrivals[-1][0] - self.arrivals[0][0]) if self.arrivals else 0.0
        self.executor = SimulatedExecutor(
            cluster,
            jobs,
            time_scale=time_scale,
            oracle=policy.oracle,
            end_latency=max(0.0, end_latency),
        )
        self.sampler = ContentionSampler(span)
        self.shortfalls = ShortfallTracker()
        self.forecaster = StartForecaster(
            self.predict_every, {job.job_id: job.user for job in jobs if job.user is not None}
        )
        schedule = scheduler if scheduler is not None else default_scheduler()
        self.core: Session | SnapshotCore = (
            Session(cluster, policy)
            if schedule is None
            else SnapshotCore(cluster, policy, schedule)
        )
        self.cycles = 0
        self.instants_cut = 0
        """Instants whose cycles ``max_cycles_per_instant`` stopped before they settled."""
        self.scheduler_s = 0.0
        self.turn = max(0.0, turn)
        self._turned = -math.inf
        """When the last turn was taken (something happened)."""

    def run(self) -> ReplayResult:
        """Replay every event; the jobs' results, the figures of the run."""
        # A replay allocates short-lived objects by the million beside a large heap that
        # lives as long as it does: a young collection every 700 allocations walks that
        # heap for nothing (7% of a saturated replay's CPU); one every 100,000 does not.
        threshold = gc.get_threshold()
        gc.set_threshold(YOUNG_COLLECTION_EVERY, *threshold[1:])
        try:
            return self._run()
        finally:
            gc.set_threshold(*threshold)

    def _run(self) -> ReplayResult:
        started = time.perf_counter()
        core = self.core
        session = core if isinstance(core, Session) else None
        executor = self.executor
        sampler = self.sampler
        shortfalls = self.shortfalls
        forecaster = self.forecaster
        arrivals = self.arrivals
        withdrawals = self.withdrawals
        index = withdrawn = changed_at = 0
        while True:
            now = math.inf
            if index < len(arrivals):
                now = arrivals[index][0]
            next_end = executor.next_end()
            if next_end < now:
                now = next_end
            if self.wakeups and self.wakeups[0] < now:
                now = self.wakeups[0]
            if withdrawn < len(withdrawals) and withdrawals[withdrawn][0] < now:
                now = withdrawals[withdrawn][0]
            if self.stops and self.stops[0][0] < now:
                now = self.stops[0][0]
            if changed_at < len(self.changes) and self.changes[changed_at][0] < now:
                now = self.changes[changed_at][0]
            now = max(now, self._turned + self.turn)
            if now == math.inf or now > self.until:
                break
            changed = False
            while changed_at < len(self.changes) and self.changes[changed_at][0] <= now:
                session = self._reconfigure(self.changes[changed_at][1], now)
                core = self.core
                changed_at += 1
                changed = True
            while index < len(arrivals) and arrivals[index][0] <= now:
                job_id = arrivals[index][2]
                forecaster.arrived(job_id)
                core.submit(executor.arrive(job_id))
                index += 1
                if self.progress is not None and index % 1000 == 0:
                    self.progress(index, len(arrivals))
                changed = True
            for finished in executor.end_due(now):
                core.gone(finished.job_id)
                forecaster.learn(
                    finished.job_id,
                    finished.queue,
                    finished.gpus,
                    finished.runtime,
                    limit=finished.limit,
                )
                if finished.again:
                    core.submit(executor.requests[finished.job_id])
                changed = True
            while withdrawn < len(withdrawals) and withdrawals[withdrawn][0] <= now:
                job_id = withdrawals[withdrawn][1]
                withdrawn += 1
                was_running = executor.withdraw(job_id, now)
                if was_running is None:
                    continue
                if was_running:
                    core.gone(job_id)
                else:
                    core.withdraw(job_id)
                changed = True
            while self.stops and self.stops[0][0] <= now:
                changed = self._preempt(heapq.heappop(self.stops)[1], now) or changed
            while self.wakeups and self.wakeups[0] <= now:
                self._wakeup_set.discard(heapq.heappop(self.wakeups))
                changed = True
            if changed and core.pending_count:
                self._settle(now)
            if changed:
                sampler.sample(now, session, executor.held_gpus)
            if forecaster.due:
                forecaster.predict(now, session, executor.first_start)
            if changed:
                shortfalls.track(now, session)
                self._turned = now
        shortfalls.track(math.inf, session, last=True)
        executor.close()
        forecaster.annotate(executor.results)
        jobs = [executor.results[job_id] for _, _, job_id in sorted(arrivals, key=lambda a: a[1])]
        return ReplayResult(
            policy=self.policy,
            jobs=jobs,
            attempts=executor.attempts,
            total_gpus=executor.total_gpus,
            cycles=self.cycles,
            instants_cut=self.instants_cut,
            preemptions=executor.preemptions,
            shortfalls=shortfalls.shortfalls if session is not None else None,
            scheduler_s=self.scheduler_s,
            forecast_s=forecaster.seconds,
            waiting_s=sampler.waiting_s,
            node_pools=executor.node_pools,
            nominal_gpus={
                q.name: sum(r.as_dict().get(GPU, 0) for r in q.nominal.values())
                for q in self.cluster.leaves
            },
            held_while_waiting=sampler.held_while_waiting,
            unusable_while_waiting=sampler.unusable_while_waiting,
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
                    if self.stop_latency and isinstance(core, Session):
                        # It stops as a live one does: holding its resources a while.
                        if core.stopping(victim.job):
                            heapq.heappush(self.stops, (now + self.stop_latency, victim.job))
                        continue
                    preempted = self._preempt(victim.job, now) or preempted
            for admit in decisions.admitted:
                self.executor.start(admit, now, core.running.get(admit.job))
            if decisions.next_wakeup is not None:
                self._wake_at(decisions.next_wakeup)
            # The real core admits everything it can in one cycle; it may do more at the
            # same instant only after a preemption or when it stopped at a bound. A
            # scheduler function is asked again while it admits anything.
            again = (
                preempted
                or bool(decisions.stats.get("truncated"))
                or (isinstance(core, SnapshotCore) and bool(decisions.admitted))
            )
            if not again or not core.pending_count:
                break
        else:
            self.instants_cut += 1

    def _reconfigure(self, cluster: Cluster, now: float) -> Session | None:
        """A new configuration is in force from ``now``: the core carries on under it
        with what it holds (a snapshot function is simply given the new cluster)."""
        self.executor.reconfigure(cluster)
        core = self.core
        if isinstance(core, SnapshotCore):
            core.cluster = cluster
            return None
        self.core = Session.from_snapshot(replace(core.snapshot(now), cluster=cluster, nodes=None))
        return self.core

    def _preempt(self, job_id: str, now: float) -> bool:
        """Stop a victim in the executor and hand it back to the core as pending."""
        request = self.executor.preempt(job_id, now)
        if request is None:
            return False
        self.core.gone(job_id)
        self.core.submit(request)
        return True

    def _wake_at(self, at: float) -> None:
        """Jobs held back by time alone (a time window) need a cycle when it opens: no
        event says so."""
        if at not in self._wakeup_set:
            self._wakeup_set.add(at)
            heapq.heappush(self.wakeups, at)


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
