"""Each queue's pending jobs in the order a cycle considers them.

Higher priority class first, then earlier submit time, then arrival order. A
:class:`QueueLine` is built whole for one snapshot (:func:`group_lines`), or kept sorted
across cycles by a :class:`~allotment.scheduler.session.Session` (:class:`SortedLine`),
so that a long backlog is not sorted again every cycle. A cycle walks each in a
:class:`Line`, and each try ends with an :class:`Outcome`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum, auto

from allotment.domain.cluster import Cluster, Queue
from allotment.domain.durations import format_duration
from allotment.domain.reasons import Reason, ReasonCode
from allotment.scheduler import ordering
from allotment.scheduler.snapshot import PendingJob


class QueueLine:
    """One queue's pending jobs in order, with their class values and ids alongside."""

    __slots__ = ("ids", "jobs", "values")

    def __init__(
        self,
        jobs: list[PendingJob] | None = None,
        values: list[int] | None = None,
        ids: list[str] | None = None,
    ) -> None:
        self.jobs: list[PendingJob] = jobs if jobs is not None else []
        self.values: list[int] = values if values is not None else []
        self.ids: list[str] = ids if ids is not None else [j.id for j in self.jobs]

    def __len__(self) -> int:
        return len(self.jobs)


def group_lines(
    pending: Iterable[PendingJob], classes: Mapping[str, int]
) -> tuple[dict[str, QueueLine], list[PendingJob]]:
    """The lines of a snapshot's pending jobs (ties keep the snapshot's order), and the
    jobs that already preempted victims or were moved (nominated)."""
    grouped: dict[str, list[PendingJob]] = {}
    preemptors: list[PendingJob] = []
    for job in pending:
        bucket = grouped.get(job.queue)
        if bucket is None:
            grouped[job.queue] = [job]
        else:
            bucket.append(job)
        if job.nominated:
            preemptors.append(job)
    lines = {}
    for name, jobs in grouped.items():
        values = ordering.sort_within_queue(jobs, classes)
        lines[name] = QueueLine(jobs, values)
    return lines, preemptors


class SortedLine(QueueLine):
    """A line kept in order as jobs arrive and leave: binary search on each job's key
    (minus class value, submit time, arrival number)."""

    __slots__ = ("_key_of", "keys")

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[tuple[int, float, int]] = []
        self._key_of: dict[str, tuple[int, float, int]] = {}

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._key_of

    def add(self, job: PendingJob, value: int, arrival: int) -> int:
        """Put ``job`` in its place; returns that place (0: the head)."""
        key = (-value, job.submit_time, arrival)
        keys = self.keys
        index = len(keys) if not keys or key > keys[-1] else bisect_left(keys, key)
        keys.insert(index, key)
        self.jobs.insert(index, job)
        self.values.insert(index, value)
        self.ids.insert(index, job.id)
        self._key_of[job.id] = key
        return index

    def _index(self, job_id: str) -> int | None:
        key = self._key_of.get(job_id)
        if key is None:
            return None
        return bisect_left(self.keys, key)

    def get(self, job_id: str) -> PendingJob | None:
        index = self._index(job_id)
        return None if index is None else self.jobs[index]

    def remove(self, job_id: str) -> PendingJob | None:
        index = self._index(job_id)
        if index is None:
            return None
        del self._key_of[job_id]
        del self.keys[index], self.values[index], self.ids[index]
        return self.jobs.pop(index)

    def remove_many(self, job_ids: Iterable[str]) -> list[PendingJob]:
        """Remove several jobs at once, returned in line order: each found by binary
        search, then cut out a run of neighbours at a time (admitted jobs are mostly
        the line's first ones), from the back so that earlier places hold."""
        key_of = self._key_of
        keys = self.keys
        places = sorted({bisect_left(keys, key_of.pop(j)) for j in set(job_ids) if j in key_of})
        removed = [self.jobs[i] for i in places]
        end = len(places)
        while end:
            start = end - 1
            while start and places[start - 1] == places[start] - 1:
                start -= 1
            cut = slice(places[start], places[end - 1] + 1)
            del keys[cut], self.jobs[cut], self.values[cut], self.ids[cut]
            end = start
        return removed

    def replace(self, job: PendingJob) -> bool:
        """Put ``job`` in the place of the job with its id (same key); False if absent."""
        index = self._index(job.id)
        if index is None:
            return False
        self.jobs[index] = job
        return True


class Outcome(Enum):
    ADMITTED = auto()
    PREEMPTING = auto()
    GATED = auto()
    """Not runnable now for a reason of its own; the queue moves on."""
    QUOTA = auto()
    """Out of quota; in a strict queue later jobs wait behind it, else those that fit
    may start (best effort)."""
    CAPACITY = auto()
    """Quota allows it, free capacity does not; it may get a reservation."""
    DEFERRED = auto()
    """It fits only where it would borrow, though its turn came among jobs that would
    not: it is tried again in the borrowers' turn (its line waits for it)."""

    # Members are singletons: hashing by identity is exact, and far cheaper than Enum's
    # hash of the name (a cycle tests outcomes against its lines' ends millions of times).
    __hash__ = object.__hash__


def uses_depth(outcome: Outcome, job: PendingJob) -> bool:
    """Whether ``job``, waiting with ``outcome``, counts toward the jobs its line is looked
    at past a block in one cycle (the policy's ``backfill_depth``). Not one short of
    quota, nor a gang short of capacity: however many of those wait, the jobs behind them
    that fit are tried (a gang's reservation, once it has one, keeps them off the nodes
    it needs). Both still count toward the cycle's bound across all queues."""
    if outcome is Outcome.QUOTA:
        return False
    return outcome is not Outcome.CAPACITY or job.replica_count == 1


@dataclass(slots=True, init=False)
class Line:
    """One leaf queue's pending jobs in order, and how far the cycle got."""

    queue: Queue
    jobs: list[PendingJob]
    values: list[int]
    ids: list[str]
    index: int
    past_block: int
    admitted_past_block: int
    blocker: PendingJob | None
    blocker_reason: Reason | None
    done: bool
    ends: frozenset[Outcome]
    """The outcomes of a head's try that end the line for the cycle: nothing past it
    starts (the policy's line rule, for this queue)."""
    pools: list[str] | None
    """Where the queue's jobs are tried, in order (computed on first use)."""
    allowed: list[str] | None
    """Every pool open to the queue."""
    own: list[str]
    """The leading part of ``pools``: those where the queue holds a guaranteed quota."""
    unsettled: int
    """The place of the last job found to need a real try (see the cycle's turns)."""

    # Written out rather than generated: a compiled core runs this one natively, while
    # a generated ``__init__`` stays interpreted (one line per queue and cycle).
    def __init__(
        self,
        *,
        queue: Queue,
        jobs: list[PendingJob],
        values: list[int],
        ids: list[str],
        ends: frozenset[Outcome] = frozenset(),
    ) -> None:
        self.queue, self.jobs, self.values, self.ids, self.ends = queue, jobs, values, ids, ends
        self.index = self.past_block = self.admitted_past_block = 0
        self.blocker = None
        self.blocker_reason = None
        self.done = False
        self.pools = self.allowed = None
        self.own = []
        self.unsettled = -1


@dataclass(slots=True)
class Reach:
    """How far a cycle looked: what a session needs to know whether the next cycle, on
    the same state, would look at anything new."""

    stopped: dict[str, int] = field(default_factory=dict)
    """Per queue whose line stopped before its end (its own bound, or a head that ends
    it), the place of the first job not looked at."""
    closed: set[str] = field(default_factory=set)
    """Queues answered without a try (closed time window, unknown or not a leaf)."""
    ripe_at: float | None = None
    """The earliest later time at which a job that was tried could hold a reservation
    that its wait alone kept it from (None: none)."""


# ------------------------------------------------------------ reasons of whole lines


def not_a_leaf(cluster: Cluster, name: str) -> Reason:
    """Why the jobs of queue ``name`` (unknown, or not a leaf) are never tried."""
    leaves = ", ".join(sorted(q.name for q in cluster.leaves))
    what = "is not a leaf queue" if name in cluster.queues else "does not exist"
    return Reason(
        ReasonCode.INVALID, f"queue {name} {what}; leaf queues: {leaves}", {"queue": name}
    )


def closed_until(name: str, opens: float | None, now: float) -> Reason:
    """Why the jobs of queue ``name`` wait while its time window is closed."""
    when = "never" if opens is None else f"in {format_duration(opens - now)}"
    return Reason(
        ReasonCode.OUTSIDE_TIME_WINDOW,
        f"queue {name} admits nothing at this hour; it opens {when}",
        {"queue": name, "opens_at": opens},
    )


def behind(lines: Iterable[Line], answered: set[str]) -> Iterator[tuple[list[str], Reason]]:
    """The jobs each line did not get to, with what they are behind (a cycle's last
    phase); nominated preemptors past a line's index keep their own outcome."""
    for line in lines:
        if line.index >= len(line.jobs):
            continue
        blocker = line.blocker
        if blocker is not None:
            why = line.blocker_reason.code.value if line.blocker_reason else "waiting"
            reason = Reason(
                ReasonCode.BEHIND_HIGHER_PRIORITY,
                f"behind {blocker.id} in queue {line.queue.name}, which waits ({why})",
                {"queue": line.queue.name, "blocking_job": blocker.id, "blocking_reason": why},
            )
        else:
            reason = Reason(
                ReasonCode.BEHIND_HIGHER_PRIORITY,
                f"behind other jobs of queue {line.queue.name}",
                {"queue": line.queue.name},
            )
        tail = line.ids[line.index :]
        if not answered.isdisjoint(tail):
            tail = [job for job in tail if job not in answered]
        yield tail, reason
