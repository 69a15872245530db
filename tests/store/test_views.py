"""The scheduler's view of stored jobs (``allotment.store.views``)."""

from __future__ import annotations

from tests.scheduler.builders import ClusterBuilder
from tests.store.test_jobs import T0, spec

from allotment.domain.lifecycle import JobState
from allotment.store.models import Attempt, Job
from allotment.store.views import running_of


def test_a_running_job_keeps_its_submit_time_its_place_in_its_queues_line() -> None:
    """The live scheduler sees when a running job was submitted, not only when this
    attempt started: after a preemption it restarts later, but it is still its queue's
    earlier work (what the ``protect`` victim rule counts a queue's guarantee against)."""
    cluster = ClusterBuilder().pool("a100", nodes=2).leaf("research", quota={"a100": {"gpu": 16}})
    job = Job(
        id="j-1",
        name="train",
        tenant="acme",
        queue="research",
        user="ada",
        type="training",
        priority_class="normal",
        spec=spec().model_dump(mode="json"),
        state=JobState.RUNNING.value,
        attempt=2,
        submit_time=T0,
        created_at=T0,
        updated_at=T0 + 900,
    )
    attempt = Attempt(job_id="j-1", number=2, state="running", start_time=T0 + 900, pool="a100")
    attempt.allocation = []
    held = running_of(job, attempt, cluster.build())
    assert (held.start_time, held.submit_time) == (T0 + 900, T0)
