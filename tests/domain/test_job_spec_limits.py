"""Every replica holds something (a CPU when it names no GPU), and a job's replicas are
capped in all and by its queue."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from allotment.domain.job import JobSpec
from allotment.domain.loading import check_job, load_cluster_text
from allotment.domain.resources import Resources


def spec(*groups: dict[str, object]) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "queue": "q", "replicas": list(groups)})


@pytest.mark.parametrize(
    ("resources", "held"),
    [
        ({}, {"cpu": 1}),
        ({"memory": "1Gi"}, {"cpu": 1, "memory": "1Gi"}),
        ({"cpu": "250m"}, {"cpu": "250m"}),
        ({"gpu": 1}, {"gpu": 1}),
        ({"gpu": 0.5, "cpu": 0}, {"gpu": 0.5}),
    ],
)
def test_fault_a_replica_without_a_gpu_holds_a_cpu(
    resources: dict[str, object], held: dict[str, object]
) -> None:
    job = spec({"count": 2, "resources": resources})
    assert job.replicas[0].resources == Resources.parse(held)
    # What is stored is what was decided: read back, it is the same.
    assert JobSpec.model_validate(job.model_dump(mode="json")) == job


def test_fault_cpu_zero_without_a_gpu_is_refused_saying_what_to_change() -> None:
    with pytest.raises(ValidationError, match="must ask for some cpu"):
        spec({"resources": {"cpu": 0, "memory": "1Gi"}})


def test_fault_a_job_has_at_most_ten_thousand_replicas_in_all() -> None:
    assert spec({"name": "a", "count": 10_000}).replica_count == 10_000
    with pytest.raises(ValidationError, match="at most 10,000 replicas in all"):
        spec({"name": "a", "count": 6_000}, {"name": "b", "count": 6_000})


CLUSTER = """
pools: [{name: p}]
nodes: [{name: n, pool: p, capacity: {gpu: 8, cpu: 64}}]
queues:
  - name: org
    max_job_replicas: 4
    children:
      - {name: small}
      - {name: wide, max_job_replicas: 16}
"""


def test_fault_a_queue_caps_the_replicas_of_one_job_at_submit() -> None:
    cluster = load_cluster_text(CLUSTER, source="test")
    five = JobSpec.model_validate({"name": "j", "queue": "small", "replicas": [{"count": 5}]})
    [issue] = check_job(five, cluster)
    assert issue.path == "replicas"
    assert "queue small accepts jobs of up to 4 replicas; this job has 5" in issue.message
    assert check_job(five.model_copy(update={"queue": "wide"}), cluster) == []
