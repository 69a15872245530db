"""A scheduler that keeps its state between cycles.

:func:`~allotment.scheduler.cycle.schedule_once` rebuilds free capacity, quota usage and
every queue's order from a whole snapshot. That is the reference, and it costs time
proportional to the fleet and the backlog on every cycle. A :class:`Session` holds the
same state and is told what changed -- a job submitted, withdrawn, started elsewhere,
being stopped, gone -- so a cycle costs only what it looks at. The decisions are made by
the same code; the session stays pure (no clock, no I/O): ``now`` is an argument.

After :meth:`Session.cycle`, admitted jobs are running in the session (their resources
held); victims of preemption are untouched: the caller reports them with
:meth:`Session.stopping` and :meth:`Session.gone` as they stop. Meanwhile their preemptor
is *nominated* (:func:`carry_nominations`): it keeps the capacity they free and waits
with ``waiting_for_preemption``, and once they are gone it is tried before anyone else.
A victim of a move (cause ``move``) was evicted only because it fits again at once
elsewhere: when it is submitted again it is nominated too (``PendingJob.moved``), and
tried right after the preemptors in the next cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from allotment.domain.cluster import Cluster, Node
from allotment.domain.durations import window_open
from allotment.scheduler.cycle import run_cycle
from allotment.scheduler.decisions import Decisions
from allotment.scheduler.lines import Reach, SortedLine
from allotment.scheduler.ordering import UNKNOWN_VALUE
from allotment.scheduler.snapshot import (
    PendingJob,
    ReplicaPlacement,
    RunningJob,
    SchedulerPolicy,
    Snapshot,
)
from allotment.scheduler.state import CycleState


def carry_nominations(
    decisions: Decisions,
    had_turn: Iterable[PendingJob],
    pending_job: Callable[[str], PendingJob | None],
    update: Callable[[PendingJob], None],
) -> None:
    """The preemptor-nomination protocol, after a cycle. A preemptor whose victims were
    all gone when the cycle began (``had_turn``), or a moved job, has had its turn first
    and competes like any job from now on; a job that preempted in this cycle is
    nominated: it ``preempting`` its victims until they are gone, however long their
    grace period."""
    for job in had_turn:
        waiting = pending_job(job.id)
        if waiting is not None and waiting.nominated:
            update(replace(waiting, preempting=(), moved=False))
    for preempt in decisions.preemptions:
        waiting = pending_job(preempt.job)
        if waiting is not None:
            victims = tuple(v.job for v in preempt.victims)
            update(replace(waiting, preempting=victims, moved=False))


class MovedJobs:
    """The jobs cycles moved (victims of cause ``move``) that have not come back yet:
    when one is submitted again it is marked ``moved`` (nominated)."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def record(self, decisions: Decisions) -> None:
        """The moves a cycle decided."""
        for preempt in decisions.preemptions:
            for victim in preempt.victims:
                if victim.cause == "move":
                    self._ids.add(victim.job)

    def returning(self, job: PendingJob) -> PendingJob:
        """``job`` as it joins a line: marked ``moved`` if a cycle moved it."""
        if job.id not in self._ids:
            return job
        self._ids.discard(job.id)
        return replace(job, moved=True)

    def still_running(self, running: Mapping[str, object]) -> None:
        """Forget a moved job that stopped without coming back (it is owed nothing)."""
        if self._ids:
            self._ids.intersection_update(running)


def victims_gone(
    preemptors: Iterable[PendingJob], running: Mapping[str, object]
) -> list[PendingJob]:
    """The preemptors none of whose victims still hold resources."""
    return [j for j in preemptors if not any(v in running for v in j.preempting)]


class Session:
    """Pending lines, running allocations and quota usage, kept across cycles."""

    def __init__(
        self,
        cluster: Cluster,
        policy: SchedulerPolicy | None = None,
        *,
        nodes: Sequence[Node] | None = None,
        now: float = 0.0,
    ) -> None:
        self.cluster = cluster
        self.policy = policy or SchedulerPolicy()
        node_list = list(cluster.nodes.values()) if nodes is None else list(nodes)
        self.nodes = node_list
        self.state = CycleState(cluster, self.policy, node_list, now=now)
        self.running: dict[str, RunningJob] = {}
        self._lines: dict[str, SortedLine] = {}
        self._queue_of: dict[str, str] = {}
        self._preemptors: dict[str, PendingJob] = {}
        self._moved = MovedJobs()
        self._occupied: dict[tuple[str, int], ReplicaPlacement] = {}
        self._classes = {name: c.value for name, c in cluster.priority_classes.items()}
        self._arrivals = 0
        self._quiet: _Quiet | None = None
        """Set by a cycle (without explanations) that decided nothing; dropped by any
        change that the next cycle could see."""

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Session:
        """A session holding exactly what ``snapshot`` holds."""
        session = cls(
            snapshot.cluster, snapshot.policy, nodes=snapshot.node_list(), now=snapshot.now
        )
        for job in snapshot.running:
            session.started(job)
        for pending in snapshot.pending:
            session.submit(pending)
        return session

    # ------------------------------------------------------------------ pending

    def submit(self, job: PendingJob) -> None:
        """A job joins its queue's line (after every job of its class submitted no
        later); one that a cycle moved comes back nominated. Its id must be new to the
        session."""
        if job.id in self._queue_of or job.id in self.running:
            raise ValueError(f"job {job.id} is already known to the session")
        job = self._moved.returning(job)
        line = self._lines.get(job.queue)
        if line is None:
            line = self._lines[job.queue] = SortedLine()
        self._arrivals += 1
        place = line.add(job, self._classes.get(job.priority_class, UNKNOWN_VALUE), self._arrivals)
        self._queue_of[job.id] = job.queue
        nominated = job.nominated
        if nominated:
            self._preemptors[job.id] = job
        quiet = self._quiet
        if quiet is not None and not nominated:
            reach = quiet.reach
            stopped = reach.stopped.get(job.queue)
            if job.queue in reach.closed or (stopped is not None and place >= stopped):
                return  # behind what the last cycle looked at: the next one would not see it
        self._quiet = None

    def withdraw(self, job_id: str) -> PendingJob | None:
        """A pending job leaves (cancelled); None if it is not pending."""
        queue = self._queue_of.pop(job_id, None)
        if queue is None:
            return None
        self._preemptors.pop(job_id, None)
        self._quiet = None
        return self._lines[queue].remove(job_id)

    def update(self, job: PendingJob) -> None:
        """Replace a pending job (same id), e.g. with its ``preempting`` victims set;
        it keeps its place unless its class or submit time changed."""
        queue = self._queue_of.get(job.id)
        if queue is None:
            raise KeyError(job.id)
        line = self._lines[queue]
        old = line.get(job.id)
        assert old is not None
        self._quiet = None
        if (
            queue == job.queue
            and old.priority_class == job.priority_class
            and old.submit_time == job.submit_time
        ):
            line.replace(job)
            if job.nominated:
                self._preemptors[job.id] = job
            else:
                self._preemptors.pop(job.id, None)
            return
        self.withdraw(job.id)
        self.submit(job)

    def pending(self) -> Iterator[PendingJob]:
        """Every pending job, queue by queue in line order."""
        for line in self._lines.values():
            yield from line.jobs

    def pending_job(self, job_id: str) -> PendingJob | None:
        queue = self._queue_of.get(job_id)
        return None if queue is None else self._lines[queue].get(job_id)

    @property
    def pending_count(self) -> int:
        return len(self._queue_of)

    def line(self, queue: str) -> Sequence[PendingJob]:
        """The pending jobs of ``queue`` in the order they are considered (read only)."""
        line = self._lines.get(queue)
        return () if line is None else line.jobs

    # ------------------------------------------------------------------ running

    def started(self, job: RunningJob) -> None:
        """A job holds an allocation that the session did not decide (e.g. restored
        after a restart). It must not be pending or running already."""
        if job.id in self._queue_of:
            raise ValueError(f"job {job.id} is pending; it cannot also be running")
        self.state.add_running(job)
        self.running[job.id] = job
        self._quiet = None

    def stopping(self, job_id: str) -> bool:
        """A running job is being stopped; it holds its resources until :meth:`gone`."""
        job = self.running.get(job_id)
        if job is None:
            return False
        self.running[job_id] = replace(job, terminating=True)
        self._quiet = None
        return self.state.mark_terminating(job_id)

    def occupy(self, devices: Iterable[tuple[str, int]]) -> None:
        """The GPU devices (node, index) that something outside Allotment holds now (an
        orphan process): none of them is given to a job until it is free again. Replaces
        the last call's set; a device a job holds is left to the job."""
        wanted = set(devices)
        if wanted != set(self._occupied):
            self._quiet = None
        for key in [k for k in self._occupied if k not in wanted]:
            self.state.vacate(self._occupied.pop(key))
        for node, device in sorted(wanted - set(self._occupied)):
            taken = self.state.occupy(node, device)
            if taken is not None:
                self._occupied[(node, device)] = taken

    @property
    def occupied(self) -> frozenset[tuple[str, int]]:
        """The devices :meth:`occupy` keeps from jobs."""
        return frozenset(self._occupied)

    def gone(self, job_id: str) -> RunningJob | None:
        """A running job ended (or was stopped): its resources are free."""
        job = self.running.pop(job_id, None)
        if job is not None:
            self._quiet = None
            self.state.remove_running(job_id)
        return job

    # ------------------------------------------------------------------ cycles

    def cycle(self, now: float, *, explain: bool = True) -> Decisions:
        """One scheduling cycle at ``now``, on the session's state. Admitted jobs leave
        their lines and run from then on. With ``explain`` off, only jobs the cycle
        looked at get a reason and ``queue_order`` stays empty (cheaper), and a cycle
        that could see nothing new since one that decided nothing is not run: it is
        answered with no decisions and ``stats["quiet"]`` set."""
        if now < self.state.now:
            raise ValueError(f"time went backwards: {now} < {self.state.now}")
        self.state.begin(now)
        quiet = self._quiet
        if quiet is not None and not explain and (quiet.until is None or now < quiet.until):
            # Nothing it could see changed since a cycle that decided nothing: this one
            # would decide nothing too (and look at the same jobs).
            wakeup = quiet.wakeup if quiet.wakeup is not None and quiet.wakeup > now else None
            return Decisions(now=now, next_wakeup=wakeup, stats=dict(_QUIET_STATS))
        self._quiet = None
        self._moved.still_running(self.running)
        had_turn = victims_gone(self._preemptors.values(), self.running)
        reach = Reach()
        decisions = run_cycle(
            self.state,
            self._lines,
            list(self._preemptors.values()),
            explain=explain,
            copy_ids=True,
            reach=reach,
        )
        if (
            not explain
            and not decisions.admitted
            and not decisions.preemptions
            and not decisions.reservations
            and not decisions.stats.get("truncated")
            and not self._preemptors
            and not self.state.terminating
        ):
            until = min(
                (t for t in (decisions.next_wakeup, reach.ripe_at) if t is not None),
                default=None,
            )
            self._quiet = _Quiet(reach=reach, until=until, wakeup=decisions.next_wakeup)
        by_queue: dict[str, list[str]] = {}
        for admit in decisions.admitted:
            queue = self._queue_of.pop(admit.job)
            by_queue.setdefault(queue, []).append(admit.job)
            self._preemptors.pop(admit.job, None)
        jobs: dict[str, PendingJob] = {}
        for queue, ids in by_queue.items():
            for job in self._lines[queue].remove_many(ids):
                jobs[job.id] = job
        for admit in decisions.admitted:
            self.running[admit.job] = admit.running(jobs[admit.job], at=now)
        carry_nominations(decisions, had_turn, self.pending_job, self.update)
        self._moved.record(decisions)
        return decisions

    def waiting_shapes(self, per_queue: int = 64) -> list[dict[str, int]]:
        """The distinct replica requests among the first ``per_queue`` jobs of each line
        (what free capacity would have to fit to be of use now)."""
        seen: dict[tuple[tuple[str, int], ...], dict[str, int]] = {}
        for line in self._lines.values():
            for job in line.jobs[:per_queue]:
                for group in job.replicas:
                    request = dict(group.resources)
                    seen.setdefault(tuple(sorted(request.items())), request)
        return list(seen.values())

    def short_of_guarantee(self) -> list[str]:
        """Leaf queues owed capacity now: the first job of the queue's line fits in its
        unused guaranteed (nominal) quota of a pool where other queues hold part of that
        guarantee, and its time window (if any) is open. After a cycle, a queue listed
        here did not get its guarantee back (reclaim is off, or it could not be placed)."""
        quota = self.state.quota
        out: list[str] = []
        for name, line in self._lines.items():
            queue = self.cluster.queues.get(name)
            if not line.jobs or queue is None or not queue.is_leaf:
                continue
            if not window_open(queue.time_windows, self.state.now):
                continue
            head = line.jobs[0]
            total = head.total()
            for pool in queue.nominal:
                if pool not in quota.pools or (head.pools and pool not in head.pools):
                    continue
                if quota.within_nominal(name, pool, total) and quota.lent_out(name, pool):
                    out.append(name)
                    break
        return out

    def snapshot(self, now: float | None = None) -> Snapshot:
        """The equivalent snapshot (for :func:`schedule_once`, estimates, tests)."""
        ordered = sorted(
            ((key[2], job) for line in self._lines.values() for key, job in _keyed(line)),
            key=lambda pair: pair[0],
        )
        return Snapshot(
            now=self.state.now if now is None else now,
            cluster=self.cluster,
            pending=[job for _, job in ordered],
            running=list(self.running.values()),
            nodes=list(self.nodes),
            policy=self.policy,
        )


_QUIET_STATS = {
    "examined": 0,
    "admitted": 0,
    "preemptions": 0,
    "reservations": 0,
    "truncated": False,
    "quiet": True,
}


@dataclass(frozen=True, slots=True)
class _Quiet:
    """A cycle that decided nothing: how far it looked, and until when time alone
    changes nothing (a time window or back-off ending, a wait long enough to reserve)."""

    reach: Reach
    until: float | None
    wakeup: float | None


def _keyed(line: SortedLine) -> Iterable[tuple[tuple[int, float, int], PendingJob]]:
    return zip(line.keys, line.jobs, strict=True)
