"""Named scheduler policies for replay, and their composition.

A policy name is one preset or several joined by ``+``; the flags of the parts are OR-ed
(``borrowing+backfill`` borrows *and* backfills, in the strict order that ``backfill``
brings). ``oracle`` and ``protect`` are modifiers. ``oracle``, added to any preset
(``default+oracle``), shows the scheduler each job's true duration as its expected
runtime, an upper bound on what runtime estimates can buy. ``protect``
(``fair-share+protect``) keeps reclaim off the jobs that a borrowing queue's guarantee
covers (its earliest submitted, within its nominal quota): what a queue borrows is its
latest work (:func:`allotment.scheduler.victims.covered`); where the preset moves jobs
(``default+protect``), a job owed its guarantee may move any queue's small jobs.

The flags are what a preset *says*; what the scheduler *does* with them is decided in one
place, :func:`allotment.scheduler.policy.compose`, which turns them into one strategy per
concern (order, victims, quota, reservations, line). Each preset's composition is listed
with :data:`PRESETS`.
"""

from __future__ import annotations

from dataclasses import fields

from allotment.domain.errors import InvalidInput
from allotment.scheduler.snapshot import SchedulerPolicy

FLAGS = ("borrowing", "preemption", "reclaim", "fair_share", "backfill", "strict_fifo")
"""The boolean switches a preset sets; every flag a preset does not name is off."""

PRESETS: dict[str, frozenset[str]] = {
    "fifo-isolated": frozenset({"strict_fifo"}),
    "borrowing": frozenset({"borrowing", "reclaim"}),
    "fair-share": frozenset({"borrowing", "reclaim", "fair_share"}),
    "backfill": frozenset({"strict_fifo", "backfill"}),
    "default": frozenset({"borrowing", "preemption", "reclaim", "fair_share", "backfill"}),
}
"""Each preset: the flags it turns on, and the strategies they compose to
(:mod:`allotment.scheduler.policy`; order, victims, quota, reservations, line).

- ``fifo-isolated``: every queue keeps to its own quota, strict first-in first-out, no
  preemption -- the baseline of a static partition. ``SubmitOrder``, ``NoPreemption``,
  ``IsolatedQuota``, ``NoReservations``, ``StrictFifo``.
- ``borrowing``: idle quota is lent and reclaimed (by preemption); FIFO order.
  ``SubmitOrder``, ``ReclaimOnly``, ``BorrowingQuota``, ``NoReservations``,
  ``BestEffortFifo``.
- ``fair-share``: borrowing, with equal priorities ordered by dominant-resource share.
  As ``borrowing`` with ``FairShareOrder``.
- ``backfill``: ``fifo-isolated`` plus backfill behind blocked heads. As
  ``fifo-isolated`` with ``Backfill`` and ``BackfillFifo``.
- ``default``: everything on (what production runs). ``FairShareOrder``,
  ``PriorityAndReclaim``, ``BorrowingQuota``, ``Backfill``, ``BestEffortFifo``.
"""

MODIFIERS = ("oracle", "protect")

DESCRIPTIONS: dict[str, str] = {
    "fifo-isolated": "own quota only, strict FIFO, no preemption",
    "borrowing": "borrow idle quota, reclaim by preemption, FIFO",
    "fair-share": "borrowing + dominant-resource fair share",
    "backfill": "fifo-isolated + backfill",
    "default": "everything on: borrowing, reclaim, preemption, fair share, backfill",
    "oracle": "modifier: the scheduler sees true durations as expected runtimes",
    "protect": "modifier: reclaim spares the jobs a borrowing queue's guarantee covers "
    "(and moves may take any queue's small jobs)",
}


class UnknownPolicy(InvalidInput):
    """A policy name that is neither a preset nor a composition of presets."""

    code = "unknown_policy"

    def __init__(self, name: str, why: str) -> None:
        known = ", ".join(PRESETS)
        super().__init__(
            f"unknown policy {name!r}: {why}; known policies: {known}; combine them with + "
            "(e.g. borrowing+backfill), add +oracle to show the scheduler true durations "
            "and +protect to spare a borrowing queue's earliest work from reclaim",
            fields={"policy": name, "known": list(PRESETS)},
        )


def parse_policy(name: str) -> SchedulerPolicy:
    """Build the :class:`SchedulerPolicy` that ``name`` stands for (``name`` kept as given).

    Raises :class:`UnknownPolicy` for an unknown part, an empty part, or a modifier alone.
    """
    text = name.strip().lower()
    parts = [p.strip() for p in text.split("+")]
    if not text or any(not p for p in parts):
        raise UnknownPolicy(name, "empty name or empty part")
    flags: set[str] = set()
    modifiers: set[str] = set()
    presets = 0
    for part in parts:
        if part in MODIFIERS:
            modifiers.add(part)
        elif part in PRESETS:
            flags |= PRESETS[part]
            presets += 1
        else:
            raise UnknownPolicy(name, f"{part!r} is not a preset")
    if presets == 0:
        which = "+".join(sorted(modifiers))
        raise UnknownPolicy(name, f"{which} modifies a preset; add it to one, e.g. default+{which}")
    values: dict[str, bool] = {flag: flag in flags for flag in FLAGS}
    return SchedulerPolicy(
        name="+".join(parts),
        oracle="oracle" in modifiers,
        protect_covered="protect" in modifiers,
        **values,
    )


def policy_flags(policy: SchedulerPolicy) -> dict[str, bool]:
    """The boolean switches of ``policy`` (for reports)."""
    return {
        f.name: getattr(policy, f.name)
        for f in fields(policy)
        if isinstance(getattr(policy, f.name), bool)
    }
