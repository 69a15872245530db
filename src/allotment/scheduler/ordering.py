"""Who goes first.

Within a queue: higher priority class first, then first come, first served. Across
queues: a head that fits in its queue's unused nominal quota goes before one that would
borrow (as in Kueue: otherwise a borrower admitted first is reclaimed at once by the
guaranteed job behind it, a preemption for nothing; a head ordered as one that would
not borrow but that fits only where it would, while that pool's owner has jobs yet to
try, goes back among the borrowers: :mod:`allotment.scheduler.borrower_turn`); then the
higher priority class;
among equal classes, the queue with the lower weighted dominant-resource share (usage /
nominal quota, the largest over pools and resources) goes first, so a queue below its
guarantee goes before one above it; waiting lowers the key by ``wait / aging_horizon``
so that no job starves. Without fair share, equal classes are served in submission
order across queues. The key across queues is the policy's order strategy
(:class:`~allotment.scheduler.policy.QueueOrder`); it is a :data:`QueueKey`.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter

from allotment.scheduler.snapshot import PendingJob

QueueKey = tuple[int, int, float, float, str]
"""(borrows, -class value, share or submit time, submit time, job id): lower goes first."""
UNKNOWN_VALUE = -1_000_000
_SUBMIT_TIME = attrgetter("submit_time")


def sort_within_queue(jobs: list[PendingJob], values: Mapping[str, int]) -> list[int]:
    """Sort one queue's jobs in place: class value (high first), then submit time, then
    the snapshot's own order. Returns each job's class value, in the new order (unknown
    classes rank last)."""
    # Linear when already in order (the usual case); the sort is stable, so jobs
    # submitted at the same instant keep the order the snapshot lists them in.
    jobs.sort(key=_SUBMIT_TIME)
    names = {j.priority_class for j in jobs}
    value_of = {name: values.get(name, UNKNOWN_VALUE) for name in names}
    if len(names) == 1:
        return [value_of[next(iter(names))]] * len(jobs)
    jobs.sort(key=lambda j: -value_of[j.priority_class])  # stable: FIFO within a class
    return [value_of[j.priority_class] for j in jobs]
