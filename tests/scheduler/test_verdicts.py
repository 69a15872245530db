"""How long a remembered failure holds (``scheduler/verdicts.py``): a session without
explanations keeps why a request failed in a pool, and answers the same request with it
while nothing it depends on changed -- decided exactly as a session that tries again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

import pytest

from allotment.scheduler import cycle as cycle_module
from allotment.scheduler.placement import Placer
from allotment.scheduler.pool_tries import PoolTries
from allotment.scheduler.session import Session
from tests.scheduler.builders import NOW, ClusterBuilder, job, patches_core, running


def sessions() -> tuple[Session, Session]:
    """Two 8-GPU nodes, both full but for four GPUs of the second; team-a, owed a whole
    node, may take nothing back (``reclaim: never``) and waits with a job of 8 GPUs."""
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=2, gpu=8)
        .leaf("team-a", quota={"a100": {"gpu": 8}}, preemption={"reclaim": "never"})
        .leaf("team-b", quota={"a100": {"gpu": 4}})
        .leaf("team-c", quota={"a100": {"gpu": 4}})
        .build()
    )
    out = (Session(cluster), Session(cluster))
    for session in out:
        for i in range(4):
            session.started(running(f"b{i}", "team-b", "a100-00", first_device=i))
            session.started(running(f"c{i}", "team-c", "a100-00", first_device=4 + i))
        session.started(running("b4", "team-b", "a100-01", gpu=2, first_device=0))
        session.started(running("c4", "team-c", "a100-01", gpu=2, first_device=2))
        session.submit(job("big", "team-a", gpu=8, submit=NOW))
    return out


@contextmanager
def counting() -> Iterator[dict[str, int]]:
    """How many tries in a pool and victim searches' candidate lists are worked out."""
    counts = {"attempts": 0, "candidates": 0}
    attempt, candidates = PoolTries.attempt, cycle_module.victim_candidates

    def counted_attempt(self: PoolTries, *args: object) -> object:
        counts["attempts"] += 1
        return attempt(self, *args)

    def counted_candidates(*args: object) -> object:
        counts["candidates"] += 1
        return candidates(*args)

    with (
        patch.object(PoolTries, "attempt", counted_attempt),
        patch.object(cycle_module, "victim_candidates", counted_candidates),
    ):
        yield counts


def cycle_both(quiet: Session, loud: Session, now: float) -> list[str]:
    a, b = quiet.cycle(now, explain=False), loud.cycle(now)
    assert a.admitted == b.admitted and a.preemptions == b.preemptions
    if "big" in b.waiting:
        assert a.waiting["big"].code == b.waiting["big"].code
    return [x.job for x in a.admitted]


@patches_core
def test_no_node_fits_holds_while_what_others_free_is_still_too_small() -> None:
    quiet, loud = sessions()
    assert cycle_both(quiet, loud, NOW) == []
    assert quiet.cycle(NOW + 1, explain=False).stats.get("quiet")  # nothing changed
    # team-c's job ends: six GPUs free on one node, still short of eight. The quiet
    # session knows the answer, and that a search would find nothing to take.
    for session in (quiet, loud):
        session.gone("c4")
    with counting() as counts:
        assert quiet.cycle(NOW + 2, explain=False).admitted == []
    assert counts == {"attempts": 0, "candidates": 0}
    assert loud.cycle(NOW + 2).admitted == []
    # team-b's ends too: the node is free, the job is tried and starts.
    for session in (quiet, loud):
        session.gone("b4")
    assert cycle_both(quiet, loud, NOW + 3) == ["big"]


@patches_core
@pytest.mark.parametrize("change", ["own job ends", "a job joins"])
def test_a_change_that_could_help_is_tried_again(change: str) -> None:
    quiet, loud = sessions()
    assert cycle_both(quiet, loud, NOW) == []
    for session in (quiet, loud):
        if change == "own job ends":
            # team-a's own job in the pool ends: its usage falls (it might reclaim).
            session.started(running("a0", "team-a", "a100-01", first_device=4))
            session.cycle(NOW + 1, explain=session is loud)
            session.gone("a0")
        else:
            # A job starts elsewhere in the pool: a possible victim joins.
            session.started(running("c5", "team-c", "a100-01", first_device=4))
    with counting() as counts:
        assert quiet.cycle(NOW + 2, explain=False).admitted == []
    assert counts["attempts"] == 1
    assert loud.cycle(NOW + 2).admitted == []


def test_the_most_whole_free_gpus_on_a_node() -> None:
    cluster = ClusterBuilder().pool("a100", nodes=2, gpu=8).leaf("q").build()
    placer = Placer(cluster.nodes.values())
    assert placer.most_whole_free("a100") == 8
    placer.allocate(running("x", "q", "a100-00", gpu=8).placements)
    placer.allocate(running("y", "q", "a100-01", gpu=3).placements)
    assert placer.most_whole_free("a100") == 5
    assert placer.most_whole_free("nowhere") == 0
