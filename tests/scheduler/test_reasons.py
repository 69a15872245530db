"""Every pending job gets one reason; the reasons name what to change."""

from __future__ import annotations

import pytest

from allotment.domain.reasons import Reason, ReasonCode
from allotment.scheduler.verdicts import most_relevant

from .builders import NOW, ClusterBuilder, codes, cycle, job, running


def cluster() -> ClusterBuilder:
    return (
        ClusterBuilder()
        .pool("a100", nodes=1)
        .pool("l40", nodes=1, queues=["b"])
        .leaf(
            "a",
            quota={"a100": {"gpu": 8}},
            priority_classes=["training", "experiment"],
            max_job={"gpu": 8},
        )
        .leaf("b", quota={"l40": {"gpu": 8}})
    )


CASES = [
    ("unknown queue", job("j", "nope"), "invalid"),
    ("class not allowed", job("j", "a", prio="production"), "invalid"),
    ("pool not open to the queue", job("j", "a", pools=["l40"]), "pool_not_allowed"),
    ("unknown pool", job("j", "a", pools=["tpu"]), "pool_not_allowed"),
    ("over max_job", job("j", "a", gpu=4, replicas=3), "exceeds_queue_limit"),
    ("never fits a node", job("j", "a", gpu=8, memory="4Ti"), "no_node_fits"),
    ("in back-off", job("j", "a", not_before=NOW + 30), "backoff"),
    ("fractional above one", job("j", "a", gpu=1.5), "invalid"),
]


@pytest.mark.parametrize(("pending", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_gate_reasons(pending, code) -> None:  # type: ignore[no-untyped-def]
    decisions = cycle(cluster().build(), [pending])
    assert codes(decisions) == {"j": code}
    assert decisions.waiting["j"].message


def test_unknown_queue_lists_leaf_queues() -> None:
    decisions = cycle(cluster().build(), [job("j", "nope")])
    assert "leaf queues: a, b" in decisions.waiting["j"].message


def test_gated_job_does_not_block_its_queue() -> None:
    decisions = cycle(
        cluster().build(), [job("bad", "a", pools=["l40"], submit=1), job("good", "a", submit=2)]
    )
    assert codes(decisions) == {"bad": "pool_not_allowed"}
    assert [a.job for a in decisions.admitted] == ["good"]


def test_every_pending_job_has_one_outcome() -> None:
    pending = [job(f"j{i}", "a", gpu=2, submit=i) for i in range(10)]
    decisions = cycle(cluster().build(), pending, [running("r", "a", "a100-00", gpu=2)])
    admitted = {a.job for a in decisions.admitted}
    assert len(admitted) == 3
    assert admitted | set(decisions.waiting) == {j.id for j in pending}
    assert not admitted & set(decisions.waiting)
    assert all(isinstance(r.code, ReasonCode) for r in decisions.waiting.values())


def test_most_relevant_prefers_job_problems_then_closest_shortage() -> None:
    quota = Reason(ReasonCode.QUOTA_EXHAUSTED, "q")
    nofit = Reason(ReasonCode.NO_NODE_FITS, "n")
    gate = Reason(ReasonCode.POOL_NOT_ALLOWED, "p")
    assert most_relevant([quota, nofit]) is nofit
    assert most_relevant([nofit, gate, quota]) is gate
    with pytest.raises(ValueError):
        most_relevant([])


def test_a_job_over_its_queues_replica_cap_waits_with_the_cap_inherited() -> None:
    built = (
        ClusterBuilder()
        .pool("a100", nodes=2)
        .parent("org", max_job_replicas=2)
        .leaf("a", parent="org", quota={"a100": {"gpu": 8}})
        .build()
    )
    assert built.queues["a"].max_job_replicas == 2
    decisions = cycle(built, [job("j", "a", gpu=1, replicas=3), job("k", "a", replicas=2)])
    assert codes(decisions) == {"j": "exceeds_queue_limit"}
    assert "up to 2 replicas" in decisions.waiting["j"].message
    assert [a.job for a in decisions.admitted] == ["k"]
