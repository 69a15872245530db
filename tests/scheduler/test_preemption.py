"""Preemption within a queue, reclaim of lent quota, borrow-only victims, reservations."""

from __future__ import annotations

from dataclasses import replace

from allotment.domain.cluster import Cluster
from allotment.scheduler.session import Session
from allotment.scheduler.snapshot import RunningJob, SchedulerPolicy, Snapshot

from .builders import (
    NOW,
    ClusterBuilder,
    admitted,
    codes,
    cycle,
    job,
    running,
    two_owned_pools,
    victims,
)


def shared(**leaf_a: object) -> ClusterBuilder:
    return (
        ClusterBuilder()
        .pool("a100", nodes=2)
        .leaf("a", quota={"a100": {"gpu": 8}}, **leaf_a)
        .leaf("b", quota={"a100": {"gpu": 8}})
    )


def test_higher_priority_preempts_lower_in_its_queue() -> None:
    cluster = shared().build()
    runs = [
        running("low", "a", "a100-00", gpu=8, prio="experiment"),
        running("other", "b", "a100-01", gpu=8),
    ]
    decisions = cycle(cluster, [job("hi", "a", gpu=8, prio="key-project")], runs)
    assert victims(decisions) == {"hi": ["low"]}
    (preempt,) = decisions.preemptions
    assert preempt.victims[0].cause == "within_queue"
    assert "key-project (800) over experiment (100)" in preempt.victims[0].message
    assert codes(decisions) == {"hi": "waiting_for_preemption"}


def test_own_victims_are_looked_for_by_class_first() -> None:
    """A queue's jobs of the preemptor's own class are no victims under
    ``lower_priority`` (the search gives up by class, without looking at each job), but
    are under ``any``; a lower class beside them still is one."""
    same = [
        running("peer", "a", "a100-00", gpu=8, prio="training"),
        running("other", "b", "a100-01", gpu=8),
    ]
    waiting = [job("hi", "a", gpu=8, prio="training")]
    assert victims(cycle(shared().build(), waiting, same)) == {}
    anyone = shared(preemption={"within_queue": "any", "reclaim": "any"}).build()
    assert victims(cycle(anyone, waiting, same)) == {"hi": ["peer"]}
    mixed = [
        running("peer", "a", "a100-00", gpu=4, prio="training"),
        running("low", "a", "a100-00", gpu=4, prio="experiment"),
        running("other", "b", "a100-01", gpu=8),
    ]
    four = [job("hi", "a", gpu=4, prio="training")]
    assert victims(cycle(shared().build(), four, mixed)) == {"hi": ["low"]}


def test_queue_policy_never_forbids_within_queue_preemption() -> None:
    cluster = shared(preemption={"within_queue": "never", "reclaim": "any"}).build()
    runs = [
        running("low", "a", "a100-00", gpu=8, prio="experiment"),
        running("other", "b", "a100-01", gpu=8),
    ]
    decisions = cycle(cluster, [job("hi", "a", gpu=8, prio="key-project")], runs)
    assert decisions.preemptions == []
    assert codes(decisions) == {"hi": "quota_exhausted"}


def test_non_preemptible_class_is_never_a_victim() -> None:
    cluster = shared().build()
    runs = [
        running("prod", "a", "a100-00", gpu=8, prio="production"),
        running("other", "b", "a100-01", gpu=8, prio="production"),
    ]
    decisions = cycle(cluster, [job("hi", "a", gpu=8, prio="production")], runs)
    assert decisions.preemptions == []


def test_a_job_of_a_non_preemptible_class_that_says_preemptible_is_a_victim() -> None:
    # A service's replicas above its minimum: production, yet given up for the owner.
    cluster = shared().build()
    runs = [
        running("kept", "a", "a100-00", gpu=8, prio="production", start=NOW - 50),
        replace(
            running("extra", "a", "a100-01", gpu=8, prio="production", start=NOW - 100),
            preemptible=True,
        ),
    ]
    decisions = cycle(cluster, [job("b1", "b", gpu=8, prio="experiment")], runs)
    assert victims(decisions) == {"b1": ["extra"]}  # the protected one stays, though newer
    assert decisions.preemptions[0].victims[0].cause == "reclaim"


def test_reclaim_borrowed_capacity_for_owner_within_nominal() -> None:
    cluster = shared().build()
    # a borrows b's whole guarantee; b now wants its own 8 GPUs back.
    runs = [
        running("a1", "a", "a100-00", gpu=8, start=NOW - 100),
        running("a2", "a", "a100-01", gpu=8, start=NOW - 50),
    ]
    decisions = cycle(cluster, [job("b1", "b", gpu=8, prio="experiment")], runs)
    assert victims(decisions) == {"b1": ["a2"]}  # least run time lost
    assert decisions.preemptions[0].victims[0].cause == "reclaim"


def test_no_reclaim_beyond_nominal() -> None:
    cluster = shared().build()
    runs = [running("a1", "a", "a100-00", gpu=8), running("b1", "b", "a100-01", gpu=4)]
    decisions = cycle(cluster, [job("b2", "b", gpu=8)], runs)
    assert decisions.preemptions == []


def test_reclaim_lower_priority_only() -> None:
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=2)
        .leaf("a", quota={"a100": {"gpu": 8}})
        .leaf(
            "b",
            quota={"a100": {"gpu": 8}},
            preemption={"within_queue": "lower_priority", "reclaim": "lower_priority"},
        )
        .build()
    )
    runs = [
        running("a1", "a", "a100-00", gpu=8, start=NOW - 100),
        running("a2", "a", "a100-01", gpu=8, start=NOW - 50),
    ]
    decisions = cycle(cluster, [job("b1", "b", gpu=8, prio="training")], runs)
    assert decisions.preemptions == []
    decisions = cycle(cluster, [job("b1", "b", gpu=8, prio="key-project")], runs)
    assert victims(decisions) == {"b1": ["a2"]}


def test_borrow_only_jobs_are_first_victims() -> None:
    cluster = shared().build()
    runs = [
        running("scav", "a", "a100-00", gpu=4, prio="scavenger", start=NOW - 10),
        running("exp", "a", "a100-00", gpu=4, prio="experiment", first_device=4, start=NOW - 999),
        running("b0", "b", "a100-01", gpu=8),
    ]
    decisions = cycle(cluster, [job("hi", "a", gpu=4, prio="training")], runs)
    assert victims(decisions) == {"hi": ["scav"]}
    assert decisions.preemptions[0].victims[0].cause == "borrow_only"


def test_smallest_victim_set() -> None:
    cluster = shared().build()
    runs = [
        running(
            f"s{i}", "a", "a100-00", gpu=1, prio="experiment", first_device=i, start=NOW - 100 + i
        )
        for i in range(8)
    ]
    runs.append(running("b0", "b", "a100-01", gpu=8))
    decisions = cycle(cluster, [job("hi", "a", gpu=2, prio="key-project")], runs)
    assert victims(decisions) == {"hi": ["s6", "s7"]}  # two newest, nothing more


def test_preemption_off_by_policy() -> None:
    cluster = shared().build()
    runs = [
        running("low", "a", "a100-00", gpu=8, prio="experiment"),
        running("other", "b", "a100-01", gpu=8),
    ]
    decisions = cycle(
        cluster,
        [job("hi", "a", gpu=8, prio="key-project")],
        runs,
        policy=SchedulerPolicy(preemption=False, reclaim=False),
    )
    assert decisions.preemptions == []


def test_freed_resources_stay_reserved_for_the_preemptor() -> None:
    cluster = shared().build()
    runs = [
        running("low", "a", "a100-00", gpu=8, prio="experiment", terminating=True),
        running("other", "b", "a100-01", gpu=4),
    ]
    pending = [
        job("hi", "a", gpu=8, prio="key-project", preempting=["low"]),
        job("sneaky", "b", gpu=4, submit=NOW - 9999, prio="production"),
    ]
    decisions = cycle(cluster, pending, runs)
    assert codes(decisions)["hi"] == "waiting_for_preemption"
    # sneaky fits on a100-01 (4 free) but not on the reserved a100-00.
    assert [a.placements[0].node for a in decisions.admitted] == ["a100-01"]
    # once the victim is gone, the preemptor is admitted
    decisions = cycle(cluster, pending[:1], runs[1:])
    assert admitted(decisions) == ["hi"]


def test_victims_not_used_by_later_jobs_in_the_same_cycle() -> None:
    cluster = shared().build()
    runs = [
        running("low", "a", "a100-00", gpu=8, prio="experiment"),
        running("other", "b", "a100-01", gpu=8),
    ]
    decisions = cycle(
        cluster,
        [
            job("hi", "a", gpu=4, prio="key-project", submit=1),
            job("next", "a", gpu=4, prio="experiment", submit=2),
        ],
        runs,
    )
    assert victims(decisions) == {"hi": ["low"]}
    assert admitted(decisions) == []


def test_preemptor_whose_victims_are_gone_goes_first_and_only_once() -> None:
    cluster = shared().build()
    runs = [running("a-run", "a", "a100-00", gpu=6), running("b-run", "b", "a100-01", gpu=8)]
    pending = [
        job("blocker", "a", gpu=4, submit=NOW - 900),  # 6 + 4 > 8: out of quota
        job("hi", "a", gpu=2, submit=NOW - 60, preempting=["gone"]),  # behind it in line
    ]
    decisions = cycle(cluster, pending, runs)
    assert admitted(decisions) == ["hi"]
    assert "hi" not in decisions.waiting
    assert codes(decisions) == {"blocker": "quota_exhausted"}
    assert len(decisions.waiting) == 1


def test_preemptor_that_needs_more_victims_says_so() -> None:
    cluster = shared().build()
    # Its first victim is gone, but another low job took the node meanwhile.
    runs = [
        running("squatter", "a", "a100-00", gpu=8, prio="experiment"),
        running("other", "b", "a100-01", gpu=8),
    ]
    pending = [job("hi", "a", gpu=8, prio="key-project", preempting=["gone"])]
    decisions = cycle(cluster, pending, runs)
    assert victims(decisions) == {"hi": ["squatter"]}
    assert codes(decisions) == {"hi": "waiting_for_preemption"}


def test_a_borrower_already_giving_back_is_not_reclaimed_twice() -> None:
    """Found live (the Kueue bench): two jobs of b each reclaimed one of a's two jobs,
    leaving a below its guarantee; a then reclaimed from b, and so on for ever. Only one
    of a's jobs is borrowing: one victim, in the same cycle or while it terminates."""
    cluster = shared().build()
    runs = [
        running("a1", "a", {"a100-00": 8}, start=NOW - 600),
        running("a2", "a", {"a100-01": 8}, start=NOW - 300),
    ]
    pending = [job("b1", "b", gpu=8), job("b2", "b", gpu=8, submit=NOW - 30)]
    decisions = cycle(cluster, pending, runs)
    assert victims(decisions) == {"b1": ["a2"]}
    assert codes(decisions)["b2"] != "waiting_for_preemption"
    terminating = [runs[0], replace(runs[1], terminating=True)]
    later = cycle(cluster, [replace(pending[0], preempting=("a2",)), pending[1]], terminating)
    assert later.preemptions == []


def owed_twice() -> tuple[Cluster, list[RunningJob]]:
    """One pool of eight 8-GPU nodes: ``c`` guaranteed 24 GPUs and running 8, ``a``
    guaranteed 16 and borrowing 40 on the seven other nodes (the newest first: ``a1``)."""
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=8)
        .leaf("a", quota={"a100": {"gpu": 16}})
        .leaf("b", quota={"a100": {"gpu": 8}})
        .leaf("c", quota={"a100": {"gpu": 24}})
        .build()
    )
    runs = [running("c-run", "c", "a100-00", gpu=8)]
    runs += [running(f"a{i}", "a", f"a100-0{i}", gpu=8, start=NOW - 100 * i) for i in range(1, 8)]
    return cluster, runs


def test_two_jobs_of_a_queue_do_not_each_take_back_the_same_unused_guarantee() -> None:
    """Found replaying a synthetic trace: a queue owed 41 GPUs had two gangs of 32
    waiting, and both took back borrowers' nodes in one cycle, each as if the other did
    not; the queue then ran beyond its guarantee, the lender was owed in turn and took
    it back, and a chain of reclaims threw away hours of work. Here c is owed 16 and two
    gangs of 16 wait. A job that preempts counts against its queue's guarantee from then
    on, while its victims stop too."""
    cluster, runs = owed_twice()
    pending = [
        job("c1", "c", gpu=8, replicas=2, submit=NOW - 120),
        job("c2", "c", gpu=8, replicas=2),
    ]
    decisions = cycle(cluster, pending, runs)
    assert victims(decisions) == {"c1": ["a1", "a2"]}
    assert codes(decisions)["c2"] != "waiting_for_preemption"
    stopping = [replace(r, terminating=True) if r.id in ("a1", "a2") else r for r in runs]
    later = cycle(cluster, [replace(pending[0], preempting=("a1", "a2")), pending[1]], stopping)
    assert later.preemptions == []
    assert codes(later) == {"c1": "waiting_for_preemption", "c2": codes(decisions)["c2"]}


def test_a_job_that_preempts_its_own_queues_job_leaves_the_rest_of_the_guarantee() -> None:
    # c runs 8 GPUs of a low class on its own and is owed 16 more. Its high job takes the
    # low one's place (within its queue): c's guarantee after that is what it was, so
    # the next job, a gang of 16, still takes back two of a's borrowed nodes.
    cluster, runs = owed_twice()
    runs[0] = running("c-low", "c", "a100-00", gpu=8, prio="experiment")
    pending = [
        job("hi", "c", gpu=8, prio="key-project", submit=NOW - 120),
        job("next", "c", gpu=8, replicas=2),
    ]
    decisions = cycle(cluster, pending, runs)
    assert victims(decisions) == {"hi": ["c-low"], "next": ["a1", "a2"]}
    assert [v.cause for p in decisions.preemptions for v in p.victims] == [
        "within_queue",
        "reclaim",
        "reclaim",
    ]


def owed_a_gang(*, nodes: int, b_gpus: int) -> Cluster:
    """One pool of 8-GPU nodes: ``a`` guaranteed 16 GPUs, ``b`` ``b_gpus``, ``c`` 8."""
    return (
        ClusterBuilder()
        .pool("a100", nodes=nodes)
        .leaf("a", quota={"a100": {"gpu": 16}})
        .leaf("b", quota={"a100": {"gpu": b_gpus}})
        .leaf("c", quota={"a100": {"gpu": 8}})
        .build()
    )


def test_a_gang_reclaims_whole_nodes_when_borrowers_spread_over_shared_ones() -> None:
    # a is owed 16 GPUs and asks for two whole nodes. b borrows 12 beyond its 8: two
    # whole nodes and four 1-GPU jobs on a node it shares with c (within its guarantee).
    # Taken one by one, the newest first, the small jobs free no node and b is back
    # within its guarantee before both whole nodes are; node by node, they are.
    cluster = owed_a_gang(nodes=4, b_gpus=8)
    runs = [
        running("b-old", "b", "a100-00", gpu=8, start=NOW - 1000),
        running("b-new", "b", "a100-01", gpu=8, start=NOW - 900),
    ]
    for i in range(4):
        runs.append(running(f"b{i}", "b", "a100-02", first_device=i, start=NOW - 100 + i))
        runs.append(running(f"c{i}", "c", "a100-02", first_device=4 + i))
        runs.append(running(f"c{i + 4}", "c", "a100-03", first_device=i))
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    assert victims(decisions) == {"gang": ["b-new", "b-old"]}
    assert {v.cause for v in decisions.preemptions[0].victims} == {"reclaim"}


def test_node_by_node_the_nodes_with_the_least_work_lost_go_first() -> None:
    # b borrows 16 GPUs beyond its 16: three nodes of its own and eight 1-GPU jobs beside
    # c's. a's gang needs two whole nodes: the two whose jobs have run the fewest GPU
    # hours, not the one holding b's most recently started job (it also holds one that has
    # run for hours).
    cluster = owed_a_gang(nodes=5, b_gpus=16)
    runs = [
        running("b-1000s", "b", "a100-00", gpu=8, start=NOW - 1000),
        running("b-900s", "b", "a100-01", gpu=8, start=NOW - 900),
        running("b-100s", "b", "a100-02", gpu=4, start=NOW - 100),
        running("b-5000s", "b", "a100-02", gpu=4, first_device=4, start=NOW - 5000),
    ]
    for node in ("a100-03", "a100-04"):
        runs += [
            running(f"b{node[-1]}{i}", "b", node, first_device=i, start=NOW - 10 + i)
            for i in range(4)
        ]
        runs += [running(f"c{node[-1]}{i}", "c", node, first_device=4 + i) for i in range(4)]
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    assert victims(decisions) == {"gang": ["b-1000s", "b-900s"]}


def test_a_job_takes_the_victim_that_loses_the_least_work() -> None:
    # a is owed one GPU. b borrows: a gang on two whole nodes and a 1-GPU job that has
    # run for two hours beside c's jobs (7,200 GPU-seconds lost if taken). A gang started
    # a minute ago loses 16 x 60 = 960 GPU-seconds and goes; one that has run ten minutes
    # (9,600) stays, and the small job goes, though the gang started more recently.
    cluster = owed_a_gang(nodes=3, b_gpus=8)
    old_small = running("b-small", "b", "a100-02", start=NOW - 7200)
    c_jobs = [running(f"c{i}", "c", "a100-02", first_device=1 + i) for i in range(7)]
    for ran, taken in ((60, "b-gang"), (600, "b-small")):
        gang = running("b-gang", "b", {"a100-00": 8, "a100-01": 8}, gpu=8, start=NOW - ran)
        decisions = cycle(cluster, [job("a1", "a", gpu=1)], [gang, old_small, *c_jobs])
        assert victims(decisions) == {"a1": [taken]}, ran


def test_with_protect_reclaim_spares_the_work_a_borrowing_queues_guarantee_covers() -> None:
    # b is guaranteed 16 GPUs and holds 17: a 2-node gang it submitted first, which had
    # to wait until a minute ago while a 1-GPU job it submitted later held part of its
    # guarantee, and that job, which has run two hours. a is owed one GPU. By work lost
    # alone the gang goes (960 GPU-seconds against 7,200), and so it would again each
    # time an owner needs room. With ``protect`` b's guarantee covers its earliest
    # submitted work, the gang, and what b borrows is the younger job: it goes.
    cluster = owed_a_gang(nodes=3, b_gpus=16)
    gang = running("b-gang", "b", {"a100-00": 8, "a100-01": 8}, gpu=8, start=NOW - 60)
    small = running("b-small", "b", "a100-02", start=NOW - 7200)
    c_jobs = [running(f"c{i}", "c", "a100-02", first_device=1 + i) for i in range(7)]
    runs = [replace(gang, submit_time=NOW - 9000), replace(small, submit_time=NOW - 8000)]
    waiting = [job("a1", "a", gpu=1)]
    assert victims(cycle(cluster, waiting, [*runs, *c_jobs])) == {"a1": ["b-gang"]}
    protect = SchedulerPolicy(protect_covered=True)
    decisions = cycle(cluster, waiting, [*runs, *c_jobs], policy=protect)
    assert victims(decisions) == {"a1": ["b-small"]}
    assert decisions.preemptions[0].victims[0].cause == "reclaim"
    # Submitted the other way round, the gang is what b borrows, and it goes.
    runs = [replace(gang, submit_time=NOW - 8000), replace(small, submit_time=NOW - 9000)]
    assert victims(cycle(cluster, waiting, [*runs, *c_jobs], policy=protect)) == {"a1": ["b-gang"]}


def test_with_protect_a_queue_owed_room_only_covered_work_holds_waits() -> None:
    # b is guaranteed 16 GPUs and holds 17: a 2-node gang, and a 1-GPU job on the third
    # node beside c's jobs (within c's guarantee). a needs a whole node, and only the
    # gang's could be freed. Submitted first, the 1-GPU job is what b's guarantee covers
    # (1 GPU; 1 + 16 > 16): the gang is what b borrows, and it goes. Submitted first, the
    # gang is covered, and what b borrows, the 1-GPU job, frees no node: a waits.
    cluster = owed_a_gang(nodes=3, b_gpus=16)
    gang = running("b-gang", "b", {"a100-00": 8, "a100-01": 8}, gpu=8, start=NOW - 60)
    small = running("b-small", "b", "a100-02", start=NOW - 7200)
    c_jobs = [running(f"c{i}", "c", "a100-02", first_device=1 + i) for i in range(7)]
    waiting = [job("a8", "a", gpu=8)]
    protect = SchedulerPolicy(protect_covered=True)
    small_first = [replace(gang, submit_time=NOW - 8000), replace(small, submit_time=NOW - 9000)]
    assert victims(cycle(cluster, waiting, [*small_first, *c_jobs], policy=protect)) == {
        "a8": ["b-gang"]
    }
    gang_first = [replace(gang, submit_time=NOW - 9000), replace(small, submit_time=NOW - 8000)]
    decisions = cycle(cluster, waiting, [*gang_first, *c_jobs], policy=protect)
    assert decisions.preemptions == []
    assert codes(decisions) == {"a8": "no_node_fits"}


def test_a_gang_takes_the_set_of_nodes_that_loses_the_least_work() -> None:
    # a's gang needs two whole nodes. b borrows a 2-node gang that has run 125 s (2,000
    # GPU-s) and two nodes of 1-GPU jobs that have run 100 s and 300 s each (800 and 2,400
    # GPU-s a node). Removed one by one, cheapest first, the small jobs free both their
    # nodes before the gang is reached (3,200 GPU-s); node by node, the gang alone does.
    cluster = owed_a_gang(nodes=5, b_gpus=8)
    runs = [running("b-gang", "b", {"a100-00": 8, "a100-01": 8}, gpu=8, start=NOW - 125)]
    for node, ran in (("a100-03", 100), ("a100-04", 300)):
        runs += [
            running(f"b{node[-1]}{i}", "b", node, first_device=i, start=NOW - ran) for i in range(8)
        ]
    runs += [running(f"c{i}", "c", "a100-02", first_device=i) for i in range(8)]
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    assert victims(decisions) == {"gang": ["b-gang"]}


def three_queues(*, nodes: int, a_gpus: int) -> Cluster:
    """8-GPU nodes in one pool; ``a`` guaranteed ``a_gpus``, ``b`` 4 and ``c`` 12."""
    return _a_and_b(nodes, a_gpus).leaf("c", quota={"a100": {"gpu": 12}}).build()


def two_queues(*, nodes: int, a_gpus: int) -> Cluster:
    """8-GPU nodes in one pool; ``a`` guaranteed ``a_gpus`` and ``b`` 4."""
    return _a_and_b(nodes, a_gpus).build()


def _a_and_b(nodes: int, a_gpus: int) -> ClusterBuilder:
    return (
        ClusterBuilder()
        .pool("a100", nodes=nodes)
        .leaf("a", quota={"a100": {"gpu": a_gpus}})
        .leaf("b", quota={"a100": {"gpu": 4}})
    )


def scattered(*, small: str = "c", prio: str = "training") -> tuple[Cluster, list[RunningJob]]:
    """Three 8-GPU nodes. ``b`` (4 GPUs guaranteed) borrows 4 beyond its guarantee;
    ``small`` (``c``, 12 guaranteed, or ``a`` itself) holds 9 GPUs in 1-GPU jobs spread
    over every node, within its guarantee, so that no node is freed by taking ``b``'s
    jobs alone; the first of them, on a100-00, is of class ``prio``. ``a`` is guaranteed
    8 GPUs (20 where the small jobs are its own) and asks for a whole node."""
    cluster = three_queues(nodes=3, a_gpus=8)
    if small == "a":
        cluster = two_queues(nodes=3, a_gpus=20)
    runs = [
        running(f"{small}0", small, "a100-00", start=NOW - 60, prio=prio),
        running("b0", "b", "a100-00", gpu=4, first_device=1),
        running(f"{small}1", small, "a100-01", start=NOW - 3600),
        running(f"{small}2", small, "a100-01", start=NOW - 3600, first_device=1),
        running("b1", "b", "a100-01", gpu=4, first_device=2),
    ]
    runs += [
        running(f"{small}{3 + i}", small, "a100-02", first_device=i, start=NOW - 7200)
        for i in range(6)
    ]
    return cluster, runs


def test_an_owed_job_moves_a_small_job_of_its_queue_that_fits_again_elsewhere() -> None:
    # a asks for a whole node. Evicting b's jobs frees none (a's own jobs are on every
    # node), but with b0 gone, a0 (run a minute) fits on a100-01 or a100-02, each with
    # two GPUs free: a0 is moved and a100-00 is the new job's.
    cluster, runs = scattered(small="a")
    decisions = cycle(cluster, [job("new", "a", gpu=8)], runs)
    assert victims(decisions) == {"new": ["a0", "b0"]}
    causes = {v.job: v.cause for v in decisions.preemptions[0].victims}
    assert causes == {"b0": "reclaim", "a0": "move"}
    moved = next(v for v in decisions.preemptions[0].victims if v.job == "a0")
    assert moved.message.startswith("moved for new (queue a): restarted on another node")
    assert codes(decisions) == {"new": "waiting_for_preemption"}
    assert decisions.preemptions[0].reason.detail["causes"] == ["move", "reclaim"]


def test_an_owed_job_never_moves_a_job_another_queue_runs_within_its_guarantee() -> None:
    # The same, but the small jobs on every node are c's, within c's guarantee: a
    # tenant does not pay for another's guarantee with restarts. Nothing that may be
    # taken frees a node; a waits for one of them to end.
    cluster, runs = scattered()
    decisions = cycle(cluster, [job("a1", "a", gpu=8)], runs)
    assert decisions.preemptions == []
    assert codes(decisions) == {"a1": "no_node_fits"}


def test_a_job_of_a_higher_priority_is_never_moved() -> None:
    # a0 outranks the new job: a100-01 is freed instead (b1 taken back, a1 and a2 moved
    # to a100-00, where b0 stays), though a1 and a2 have run an hour.
    cluster, runs = scattered(small="a", prio="key-project")
    decisions = cycle(cluster, [job("new", "a", gpu=8)], runs)
    assert victims(decisions) == {"new": ["a1", "a2", "b1"]}


def test_moves_only_where_preemption_and_reclaim_are_both_on() -> None:
    # The `borrowing` preset (reclaim, no priority preemption) keeps to reclaim: nothing
    # it may take frees a node here.
    cluster, runs = scattered()
    policy = SchedulerPolicy(preemption=False, reclaim=True)
    decisions = cycle(cluster, [job("a1", "a", gpu=8)], runs, policy=policy)
    assert decisions.preemptions == []


def test_a_moved_job_comes_back_first_to_the_room_it_was_promised() -> None:
    # As above, a0 is moved for the new job. It comes back while two 2-GPU jobs of its
    # queue, submitted before it, wait for the only two holes of two GPUs: first in
    # line, they would take both and leave a0 waiting. a0 is tried first (after the new
    # job) and restarts at once; one of them takes the other hole.
    cluster, runs = scattered(small="a")
    session = Session.from_snapshot(
        Snapshot(now=NOW, cluster=cluster, pending=[job("new", "a", gpu=8)], running=runs)
    )
    decisions = session.cycle(NOW)
    assert victims(decisions) == {"new": ["a0", "b0"]}
    for victim in ("b0", "a0"):
        session.gone(victim)
    session.submit(job("a-x", "a", gpu=2, submit=NOW - 600))
    session.submit(job("a-y", "a", gpu=2, submit=NOW - 590))
    session.submit(job("a0", "a", gpu=1, submit=NOW - 60))
    returned = session.pending_job("a0")
    assert returned is not None and returned.moved
    after = session.cycle(NOW + 1)
    assert admitted(after) == ["new", "a0", "a-x"]
    assert not any(j.moved or j.preempting for j in session.pending())


def spread_borrower(small: str = "c") -> tuple[Cluster, list[RunningJob]]:
    """Four 8-GPU nodes. ``small`` (``c``, 12 guaranteed, or ``a``) has three 1-GPU jobs
    on every node; ``b`` (4) borrows 2 of ``a``'s 16 (28 where the small jobs are
    ``a``'s, and there is no ``c``): two 2-GPU jobs on a100-00 and one GPU on a100-01
    and a100-02. What is on a100-00 started ten seconds ago (the cheapest to restart);
    the rest has run two hours."""
    cluster = three_queues(nodes=4, a_gpus=16)
    if small == "a":
        cluster = two_queues(nodes=4, a_gpus=28)
    new, old = NOW - 10, NOW - 7200
    runs = [
        running("b00", "b", "a100-00", gpu=2, start=new),
        running("b01", "b", "a100-00", gpu=2, first_device=2, start=new),
        running("b1", "b", "a100-01", start=old),
        running("b2", "b", "a100-02", start=old),
    ]
    for n in range(4):
        first = {0: 4, 1: 1, 2: 1, 3: 0}[n]
        runs += [
            running(
                f"{small}{n}{i}",
                small,
                f"a100-0{n}",
                first_device=first + i,
                start=new if n == 0 else old,
            )
            for i in range(3)
        ]
    return cluster, runs


def test_a_move_never_takes_a_borrower_back_within_its_guarantee() -> None:
    # a asks for a whole node. a100-00 would be the cheapest to clear, but only by
    # taking both of b's jobs there, and b is back at its guarantee after the first:
    # it would be owed in turn. Another node is cleared instead, b keeping its 4 GPUs.
    cluster, runs = spread_borrower(small="a")
    decisions = cycle(cluster, [job("new", "a", gpu=8)], runs)
    (preempt,) = decisions.preemptions
    taken = {v.job for v in preempt.victims}
    assert not taken & {"b00", "b01"}
    assert {v.cause for v in preempt.victims} <= {"move", "reclaim"}
    held_by_b = sum(r.total()["gpu"] for r in runs if r.queue == "b" and r.id not in taken)
    assert held_by_b >= 4 * 1000


def test_a_gang_is_not_given_room_by_moving_other_queues_jobs() -> None:
    # a's gang asks for two whole nodes; b's borrowing frees none (c is on every node).
    # A gang moves only its own queue's jobs (c's would restart on several nodes at
    # once for it): the gang waits.
    cluster, runs = spread_borrower()
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    assert decisions.preemptions == []
    assert codes(decisions) != {"gang": "waiting_for_preemption"}


def test_with_protect_a_gang_owed_its_guarantee_moves_any_queues_small_jobs() -> None:
    # Four 8-GPU nodes. b (8 guaranteed) holds a gang of 2 x 4 GPUs on a100-00 and -01
    # that it submitted first, so its guarantee covers it, and borrows 4 GPUs with a job
    # it submitted later, on a100-02 beside c's 4-GPU job; c (8) has a 2-GPU job on
    # a100-03 as well. a's gang of two whole nodes is owed its guarantee. Taking b's
    # young gang frees two nodes at once, and so it goes without protect. With protect
    # it is spared: b's borrowed job is reclaimed and c's two jobs, another queue's,
    # restart beside b's gang, where they fit at once; a's gang gets a100-02 and -03.
    cluster = owed_a_gang(nodes=4, b_gpus=8)
    runs = [
        replace(
            running("b-gang", "b", {"a100-00": 4, "a100-01": 4}, gpu=4, start=NOW - 60),
            submit_time=NOW - 9000,
        ),
        replace(running("b-lent", "b", "a100-02", gpu=4, start=NOW - 7200), submit_time=NOW - 8000),
        running("c-four", "c", "a100-02", gpu=4, first_device=4, start=NOW - 60),
        running("c-two", "c", "a100-03", gpu=2, start=NOW - 60),
    ]
    waiting = [job("gang", "a", gpu=8, replicas=2)]
    assert victims(cycle(cluster, waiting, runs)) == {"gang": ["b-gang"]}
    decisions = cycle(cluster, waiting, runs, policy=SchedulerPolicy(protect_covered=True))
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {
        "b-lent": "reclaim",
        "c-four": "move",
        "c-two": "move",
    }
    assert codes(decisions) == {"gang": "waiting_for_preemption"}


def test_a_gang_moves_its_own_queues_small_jobs_to_get_whole_nodes() -> None:
    # Four 8-GPU nodes. a (24 guaranteed) holds 3 GPUs: a 1-GPU job on each of a100-00,
    # -01 and -02, so no two nodes are whole even with every borrower gone. b (8
    # guaranteed) fills a100-03 and borrows 4 GPUs on a100-02. a's gang of two whole
    # nodes is owed its guarantee (3 + 16 <= 24): a's two jobs that have run the least
    # restart on a100-02 beside b's, and a100-00 and -01 are the gang's. b keeps all it
    # holds; a job of a's that could go nowhere else would not be moved.
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=4)
        .leaf("a", quota={"a100": {"gpu": 24}})
        .leaf("b", quota={"a100": {"gpu": 8}})
        .build()
    )
    runs = [running(f"a{n}", "a", f"a100-0{n}", start=NOW - 60 * (n + 1)) for n in range(3)]
    runs += [running("b-own", "b", "a100-03", gpu=8, start=NOW - 7200)]
    runs += [running("b-lent", "b", "a100-02", gpu=4, first_device=1, start=NOW - 7200)]
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {"a0": "move", "a1": "move"}
    assert codes(decisions) == {"gang": "waiting_for_preemption"}


def borrowed_gang(*, gang_ran: float, small_ran: float) -> tuple[Cluster, list[RunningJob]]:
    """Five 8-GPU nodes. ``a`` (24 guaranteed) holds a 1-GPU job on each of a100-00 and
    -01, started ``small_ran`` seconds ago; ``b`` (8 guaranteed) runs a gang of two
    whole nodes, a100-02 and -03, started ``gang_ran`` seconds ago: it borrows 8 GPUs;
    ``c`` (8 guaranteed) holds 4 GPUs on a100-04. No node is whole."""
    cluster = (
        ClusterBuilder()
        .pool("a100", nodes=5)
        .leaf("a", quota={"a100": {"gpu": 24}})
        .leaf("b", quota={"a100": {"gpu": 8}})
        .leaf("c", quota={"a100": {"gpu": 8}})
        .build()
    )
    runs = [running(f"a{n}", "a", f"a100-0{n}", start=NOW - small_ran) for n in range(2)]
    runs += [running("b-gang", "b", {"a100-02": 8, "a100-03": 8}, gpu=8, start=NOW - gang_ran)]
    runs += [running("c-own", "c", "a100-04", gpu=4, start=NOW - 7200)]
    return cluster, runs


def test_a_gang_moves_its_own_small_jobs_rather_than_throw_away_a_long_run_gang() -> None:
    # a's gang of two whole nodes is owed its guarantee (2 + 16 <= 24). Taking back b's
    # gang would free two nodes, but throw away 16 GPUs x 5 hours of work; moving a's
    # two 1-GPU jobs (run 10 minutes) to a100-04 frees a100-00 and -01 for 2 GPUs x 10
    # minutes, far less than half as much: the moves are taken, and b's gang runs on.
    cluster, runs = borrowed_gang(gang_ran=5 * 3600, small_ran=600)
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {"a0": "move", "a1": "move"}
    assert codes(decisions) == {"gang": "waiting_for_preemption"}


def test_a_gang_takes_back_a_borrowers_gang_that_loses_less_than_moves_would() -> None:
    # The same, but b's gang started a minute ago and a's small jobs have run five
    # hours: taking b's gang back loses less, and a's jobs stay where they are.
    cluster, runs = borrowed_gang(gang_ran=60, small_ran=5 * 3600)
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {"b-gang": "reclaim"}


def fragmented_owner() -> tuple[Cluster, list[RunningJob]]:
    """Pool v100, two 4-GPU nodes, is b's (8 guaranteed): b holds 2 GPUs on each node,
    the one on v100-01 started a minute ago. Pool a100 (one 8-GPU node) is a's and full.
    Nobody else holds part of b's guarantee."""
    cluster = two_owned_pools()
    runs = [
        running("a-run", "a", "a100-00", gpu=8),
        running("b-old", "b", "v100-00", gpu=2, start=NOW - 7200),
        running("b-new", "b", "v100-01", gpu=2, start=NOW - 60),
    ]
    return cluster, runs


def test_an_owed_job_moves_its_queues_jobs_before_another_queue_borrows_the_room() -> None:
    # b's 4-GPU job fits b's guarantee but no node: each has 2 free. With nobody else in
    # the pool, b does not restart its own jobs for it (it waits for one to end).
    cluster, runs = fragmented_owner()
    alone = cycle(cluster, [job("b-big", "b", gpu=4, submit=NOW - 300)], runs)
    assert alone.preemptions == []
    assert codes(alone) == {"b-big": "no_node_fits"}
    # a's 2-GPU job would borrow those free GPUs: admitted, it would leave b owed its
    # guarantee, and b would take it back in the next cycle (a preemption for nothing).
    # So b moves b-new beside b-old first, and a's job waits this cycle, told why.
    decisions = cycle(
        cluster,
        [job("b-big", "b", gpu=4, submit=NOW - 300), job("a-small", "a", gpu=2)],
        runs,
    )
    assert admitted(decisions) == []
    (preempt,) = decisions.preemptions
    assert preempt.job == "b-big"
    assert {v.job: v.cause for v in preempt.victims} == {"b-new": "move"}
    assert codes(decisions) == {
        "b-big": "waiting_for_preemption",
        "a-small": "behind_higher_priority",
    }
    reason = decisions.waiting["a-small"]
    assert "queue b is moving jobs there to make room for b-big" in reason.message
    assert reason.detail["reserved_for"] == ["b-big"]


def test_an_owed_jobs_own_reservation_does_not_keep_it_from_moving_its_queues_jobs() -> None:
    # As above, but b-big has waited five hours and b's jobs have known ends, so it
    # first gets a backfill reservation: v100-00 once b-old ends. When a's job would
    # then borrow the free GPUs, b-big is tried again with moves allowed; the room it
    # reserved for itself must not stand in its own way (b-new moves onto that node,
    # the reservation is dropped), and a's job waits.
    cluster, runs = fragmented_owner()
    ends = {"b-old": NOW + 3600, "b-new": NOW + 7200}
    runs = [replace(r, expected_end=ends.get(r.id)) for r in runs]
    big = job("b-big", "b", gpu=4, submit=NOW - 5 * 3600)
    alone = cycle(cluster, [big], runs)
    assert alone.reservations == {"b-big": NOW + 3600}
    decisions = cycle(cluster, [big, job("a-small", "a", gpu=2)], runs)
    assert admitted(decisions) == []
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {"b-new": "move"}
    assert "b-big" not in decisions.reservations
    assert codes(decisions) == {
        "b-big": "waiting_for_preemption",
        "a-small": "behind_higher_priority",
    }


def test_a_borrower_still_takes_room_an_owed_job_could_not_get_by_moves() -> None:
    # b's jobs outrank its waiting one: no move makes room for it, and a's job borrows
    # the free GPUs as before.
    cluster, runs = fragmented_owner()
    runs = [r if r.queue == "a" else replace(r, priority_class="key-project") for r in runs]
    decisions = cycle(
        cluster,
        [job("b-big", "b", gpu=4, submit=NOW - 300), job("a-small", "a", gpu=2)],
        runs,
    )
    assert decisions.preemptions == []
    assert admitted(decisions) == ["a-small"]


def borrowed_pool(nodes: int, a_gpus: int, c_gpus: int = 0) -> tuple[Cluster, list[RunningJob]]:
    """Pool a100 (``nodes`` 8-GPU nodes) guarantees ``a_gpus`` to a (and ``c_gpus`` to
    c); pool v100 (one 8-GPU node) is b's and full, so b's jobs in a100 borrow."""
    builder = (
        ClusterBuilder()
        .pool("a100", nodes=nodes)
        .pool("v100", nodes=1)
        .leaf("a", quota={"a100": {"gpu": a_gpus}})
        .leaf("b", quota={"v100": {"gpu": 8}})
    )
    if c_gpus:
        builder = builder.leaf("c", quota={"a100": {"gpu": c_gpus}})
    return builder.build(), [running("b-own", "b", "v100-00", gpu=8)]


def test_an_owed_job_moves_another_of_its_jobs_when_the_cheapest_fits_nowhere_else() -> None:
    # Pool a100, three 8-GPU nodes, is a's (24 guaranteed). b, its own pool full,
    # borrows 4 GPUs there: two 1-GPU jobs beside a's 2- and 4-GPU jobs on each of
    # a100-00 and -01. a100-02 holds two 4-GPU jobs of a's. a's 4-GPU job is owed its
    # guarantee (20 + 4 <= 24), but no node has 4 GPUs free even with every borrower
    # gone. On a100-00 the cheapest job to move is the 4-GPU one (an hour run), and it
    # fits on no other node; moving the 2-GPU one (three hours) instead does: with b's
    # two jobs there gone, a100-00 has four GPUs free for the new job, and the 2-GPU job
    # fits where b's two on a100-01 leave room.
    cluster, runs = borrowed_pool(3, a_gpus=24)
    for n in (0, 1):
        node = f"a100-0{n}"
        runs += [
            running(f"a-two{n}", "a", node, gpu=2, start=NOW - 3 * 3600),
            running(f"a-four{n}", "a", node, gpu=4, first_device=2, start=NOW - 3600),
            running(f"b{n}0", "b", node, first_device=6),
            running(f"b{n}1", "b", node, first_device=7),
        ]
    runs += [running(f"a-full{i}", "a", "a100-02", gpu=4, first_device=4 * i) for i in (0, 1)]
    decisions = cycle(cluster, [job("new", "a", gpu=4)], runs)
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {
        "a-two0": "move",
        "b00": "reclaim",
        "b01": "reclaim",
        "b10": "reclaim",
        "b11": "reclaim",
    }
    assert codes(decisions) == {"new": "waiting_for_preemption"}


def test_a_moved_job_may_get_its_room_by_moving_another_job_of_the_queue() -> None:
    # Pool a100, three 8-GPU nodes: a is guaranteed 13 GPUs, c 11 (all of them held: a
    # 4-GPU job on a100-01, a 7-GPU one on a100-02). b, its own pool full, borrows 4 GPUs
    # in 1-GPU jobs on a100-00 beside a's 4-GPU job x; a's 1-GPU job y is on a100-01.
    # a's whole-node job is owed its guarantee (5 + 8 <= 13). Only a100-00 can be
    # freed: x must go elsewhere, and no node has 4 GPUs free even with b's jobs gone.
    # But a100-01 has, once y moves to the GPU free on a100-02: a chain of two moves.
    cluster, runs = borrowed_pool(3, a_gpus=13, c_gpus=11)
    runs += [
        running("x", "a", "a100-00", gpu=4),
        running("c4", "c", "a100-01", gpu=4),
        running("y", "a", "a100-01", first_device=4),
        running("c7", "c", "a100-02", gpu=7),
    ]
    runs += [running(f"b{i}", "b", "a100-00", first_device=4 + i) for i in range(4)]
    decisions = cycle(cluster, [job("new", "a", gpu=8)], runs)
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {
        "x": "move",
        "y": "move",
        **dict.fromkeys((f"b{i}" for i in range(4)), "reclaim"),
    }
    assert codes(decisions) == {"new": "waiting_for_preemption"}


def test_a_job_moved_for_one_replica_of_a_gang_leaves_room_reclaim_frees_for_another() -> None:
    # Pool a100, four 8-GPU nodes, is a's (32 guaranteed); b, its own pool full, borrows
    # there. a's gang of two whole nodes is owed its guarantee (16 + 16 <= 32). Reclaim
    # alone clears a100-01 (b's two jobs; one GPU free beside them). a100-00, cheaper,
    # holds b's jobs that started a minute ago and a 1-GPU job of a's, which must move:
    # placed where it fits as things are, on a100-01's free GPU, it would leave no second
    # node for the gang (a's other jobs, of a higher priority, never move). It goes to
    # a100-02 instead, where b's 1-GPU job is reclaimed for it.
    cluster, runs = borrowed_pool(4, a_gpus=32)
    old, new = NOW - 7200, NOW - 60
    runs += [
        running("b00", "b", "a100-00", start=new),
        running("b01", "b", "a100-00", first_device=1, start=new),
        running("b02", "b", "a100-00", gpu=4, first_device=2, start=new),
        running("a-one", "a", "a100-00", first_device=6, start=NOW - 120),
        running("b03", "b", "a100-00", first_device=7, start=new),
        running("b10", "b", "a100-01", gpu=4, start=old),
        running("b11", "b", "a100-01", gpu=3, first_device=4, start=old),
        running("a-seven", "a", "a100-02", gpu=7, start=old, prio="key-project"),
        running("b20", "b", "a100-02", first_device=7, start=old),
        running("a-eight", "a", "a100-03", gpu=8, start=old, prio="key-project"),
    ]
    decisions = cycle(cluster, [job("gang", "a", gpu=8, replicas=2)], runs)
    (preempt,) = decisions.preemptions
    assert {v.job: v.cause for v in preempt.victims} == {
        "a-one": "move",
        **dict.fromkeys(("b00", "b01", "b02", "b03", "b10", "b11", "b20"), "reclaim"),
    }
    assert codes(decisions) == {"gang": "waiting_for_preemption"}
