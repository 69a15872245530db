"""Devices that something outside Allotment holds are given to no job until freed."""

from __future__ import annotations

from allotment.scheduler.session import Session

from .builders import NOW, ClusterBuilder, job, running


def session() -> Session:
    cluster = ClusterBuilder().pool("p", nodes=1, gpu=2).leaf("a", quota={"p": {"gpu": 2}}).build()
    return Session(cluster, now=NOW)


def test_an_occupied_device_is_skipped_and_given_back_when_freed() -> None:
    s = session()
    s.occupy({("p-00", 0)})
    s.submit(job("one", "a", gpu=1))
    s.submit(job("two", "a", gpu=1, submit=NOW - 30))
    decisions = s.cycle(NOW)
    [admitted] = decisions.admitted
    assert [p.devices for p in admitted.placements] == [(1,)]
    assert [j.id for j in s.pending()] == ["two"]
    s.occupy(set())
    [later] = s.cycle(NOW + 1).admitted
    assert (later.job, [p.devices for p in later.placements]) == ("two", [(0,)])


def test_a_device_a_job_holds_stays_the_jobs() -> None:
    s = session()
    s.started(running("r", "a", "p-00", gpu=1))  # device 0
    s.occupy({("p-00", 0), ("p-00", 1), ("elsewhere", 0)})
    assert s.occupied == {("p-00", 1)}
    s.gone("r")
    s.submit(job("j", "a", gpu=1))
    [admitted] = s.cycle(NOW).admitted
    assert [p.devices for p in admitted.placements] == [(0,)]
