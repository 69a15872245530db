"""The service controller on a real store (SQLite and PostgreSQL), with a fake clock,
fake health probes and replica jobs moved by hand: restarts with back-off, crash loops,
readiness, health failures, autoscaling, rolling updates and deletion, decision by
decision. (``tests/server/test_service_acceptance.py`` runs the same with real
processes and real HTTP.)"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.api.services import Services
from allotment.control.services import DRAIN_S, ServiceController, ServiceTraffic
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import JobState
from allotment.store import services as service_store
from allotment.store.jobs import events_for
from allotment.store.models import Job, Service
from tests.store.conftest import engine, sessions  # noqa: F401  (both stores)

pytestmark = pytest.mark.usefixtures("engine")


class World:
    def __init__(self, sessions: sessionmaker[Session]) -> None:  # noqa: F811
        self.sessions = sessions
        self.now = 1_000.0
        self.healthy: dict[int, bool] = {}
        self.traffic = ServiceTraffic(clock=lambda: self.now)
        ports = itertools.count(20_000)
        self.woken = 0
        self.controller = ServiceController(
            sessions,
            traffic=self.traffic,
            clock=lambda: self.now,
            wake=self._wake,
            probe=self._probe,
            free_port=lambda: next(ports),
        )

    def _wake(self) -> None:
        self.woken += 1

    def _probe(self, url: str, timeout: float) -> bool:
        port = int(url.split(":")[2].split("/")[0])
        return self.healthy.get(port, True)

    def apply(self, **service: Any) -> None:
        spec = JobSpec.model_validate(
            {
                "name": "web",
                "queue": "serving",
                "type": "service",
                "replicas": [{"count": 1, "resources": {"gpu": 1}}],
                "command": ["serve"],
                "service": service,
            }
        )
        with self.sessions.begin() as db:
            service_store.apply_service(
                db, spec, tenant="t", user="u", priority_class="training", at=self.now
            )

    def step(self, seconds: float = 0.0) -> dict[str, Any]:
        self.now += seconds
        self.controller.step()
        return self.service()

    def service(self) -> dict[str, Any]:
        with self.sessions() as db:
            found = service_store.get_service(db, "t", "web")
            jobs = service_store.replica_jobs(db, found)
            return {
                "desired": found.desired,
                "failures": found.failures,
                "restarts": found.restarts,
                "reason": found.reason_code,
                "message": found.reason_message or "",
                "replicas": [
                    {
                        **r,
                        "state": jobs[r["job"]].state,
                        "not_before": jobs[r["job"]].not_before,
                        "env": jobs[r["job"]].spec["env"],
                    }
                    for r in found.replicas
                ],
            }

    def live(self) -> list[dict[str, Any]]:
        return [r for r in self.service()["replicas"] if not r.get("retired")]

    def move(self, job_id: str, state: JobState, failure: str | None = None) -> None:
        with self.sessions.begin() as db:
            job = db.get(Job, job_id)
            assert job is not None
            job.state = state.value
            job.failure_class = failure

    def run_all(self) -> None:
        for record in self.live():
            if record["state"] == JobState.PENDING.value:
                self.move(record["job"], JobState.RUNNING)


@pytest.fixture
def world(sessions: sessionmaker[Session]) -> World:  # noqa: F811
    return World(sessions)


def test_the_first_step_makes_min_replicas_as_jobs_each_with_its_own_port(world: World) -> None:
    world.apply(replicas={"min": 2, "max": 4})
    service = world.step()
    assert [r["state"] for r in service["replicas"]] == ["pending", "pending"]
    ports = [r["env"]["PORT"] for r in service["replicas"]]
    assert ports == ["20000", "20001"]
    assert {r["env"]["ALLOTMENT_SERVICE"] for r in service["replicas"]} == {"web"}
    assert service["reason"] == "scaling" and "0 of 2 replicas ready" in service["message"]
    assert [r["preemptible"] for r in service["replicas"]] == [False, False]
    assert world.woken == 1
    assert world.step()["replicas"] == service["replicas"]  # nothing more to do
    assert world.woken == 1


def test_a_replica_is_ready_after_its_first_passing_check_and_the_route_has_it(
    world: World,
) -> None:
    world.apply(replicas={"min": 2, "max": 2})
    world.step()
    world.run_all()
    world.healthy[20001] = False
    service = world.step()
    assert [r["ready"] for r in service["replicas"]] == [True, False]
    assert service["reason"] == "scaling"
    route = Services.route_of(world.sessions, "t", "web")
    assert route is not None and route.ports == (20000,)
    world.healthy[20001] = True
    assert world.step()["reason"] == "ready"


def test_a_replica_that_dies_is_replaced_at_once_with_a_back_off_that_grows(world: World) -> None:
    world.apply(replicas={"min": 1, "max": 1}, restart={"backoff": "2s", "crash_loop_after": 3})
    world.step()
    world.run_all()
    world.step()
    for n, delay in enumerate((2.0, 4.0, 8.0), start=1):
        [record] = world.live()
        world.move(record["job"], JobState.FAILED, "user_code")
        service = world.step()
        [new] = [r for r in service["replicas"] if r["job"] != record["job"]]
        assert new["state"] == "pending" and new["not_before"] == world.now + delay
        assert service["failures"] == n and service["restarts"] == n
        world.move(new["job"], JobState.RUNNING)
        world.healthy[new["port"]] = False  # it never becomes ready
    assert service["reason"] == "crash_loop"
    assert "3 replica failures in a row" in service["message"]
    assert "the last ended user_code" in service["message"]
    assert "next start in 8s" in service["message"]
    # One that becomes ready resets the count.
    [record] = world.live()
    world.healthy[record["port"]] = True
    service = world.step()
    assert service["failures"] == 0 and service["reason"] == "ready"


def test_failed_health_checks_stop_a_ready_replica_and_it_is_replaced(world: World) -> None:
    world.apply(replicas={"min": 1, "max": 1}, health={"interval": "1s", "failure_threshold": 3})
    world.step()
    world.run_all()
    [first] = world.step()["replicas"]
    assert first["ready"]
    world.healthy[first["port"]] = False
    for _ in range(2):
        assert world.step(1.0)["replicas"][0]["state"] == "running"
    service = world.step(1.0)
    assert service["replicas"][0]["state"] == "cancelled"  # stopped on purpose...
    assert service["restarts"] == 1  # ...and counted as a failure
    assert len(world.live()) == 1 and world.live()[0]["job"] != first["job"]


def test_a_replica_never_ready_is_stopped_after_its_start_timeout(world: World) -> None:
    world.apply(health={"start_timeout": "10s"})
    world.step()
    world.run_all()
    world.healthy[20000] = False
    world.step()
    assert world.step(9.0)["replicas"][0]["state"] == "running"
    assert world.step(2.0)["replicas"][0]["state"] == "cancelled"


def test_autoscaling_up_at_once_and_down_after_the_delay(world: World) -> None:
    world.apply(
        replicas={"min": 1, "max": 3},
        autoscaling={"target": 10, "window": "10s", "scale_down_delay": "30s"},
    )
    world.step()
    service_id = _service_id(world)
    for _ in range(25):
        world.traffic.begin(service_id)
    assert world.step(1.0)["desired"] == 3  # 25 in flight at 10 per replica
    assert len(world.live()) == 3
    # Above the minimum of one, replicas may be preempted whatever their class.
    assert [r["preemptible"] for r in world.live()] == [False, True, True]
    with world.sessions() as db:
        jobs = [db.get(Job, r["job"]) for r in world.live()]
        assert [j.spec["preemptible"] for j in jobs if j is not None] == [False, True, True]
    for _ in range(25):
        world.traffic.end(service_id)
    assert world.step(5.0)["desired"] == 3  # the average still asks for more
    assert world.step(20.0)["desired"] == 3  # idle, but not for 30 s yet
    service = world.step(15.0)
    assert service["desired"] == 1
    assert len(world.live()) == 1
    assert sum(r["state"] == "cancelled" for r in service["replicas"]) == 2


def test_a_reaped_replica_above_the_minimum_is_not_replaced(world: World) -> None:
    world.apply(replicas={"min": 1, "max": 3}, autoscaling={"target": 1})
    world.step()
    service_id = _service_id(world)
    world.traffic.begin(service_id)
    world.traffic.begin(service_id)
    world.step(1.0)
    world.run_all()
    world.step()
    with world.sessions() as db:
        protected = service_store.protected_replicas(db)
    first, second = world.live()
    assert protected == {first["job"]}
    world.move(second["job"], JobState.RECLAIMED)
    world.traffic.end(service_id)
    world.traffic.end(service_id)
    service = world.step(1.0)
    assert service["restarts"] == 0 and len(world.live()) == 1


def test_a_rolling_update_stops_old_replicas_as_new_ones_become_ready(world: World) -> None:
    world.apply(replicas={"min": 2, "max": 2})
    world.step()
    world.run_all()
    world.step()
    world.apply(replicas={"min": 2, "max": 2}, health={"path": "/v2"})
    service = world.step()
    states = [(r["generation"], r["state"], bool(r.get("retired"))) for r in service["replicas"]]
    assert states == [(1, "running", False)] * 2 + [(2, "pending", False)] * 2
    new = [r for r in world.live() if r["generation"] == 2]
    world.move(new[0]["job"], JobState.RUNNING)
    service = world.step()
    retired = [r for r in service["replicas"] if r.get("retired")]
    assert len(retired) == 1 and retired[0]["generation"] == 1
    world.move(new[1]["job"], JobState.RUNNING)
    service = world.step()
    assert {r["generation"] for r in world.live()} == {2}
    assert service["restarts"] == 0


def test_a_ready_replica_stopped_on_purpose_is_drained_before_its_job_is_cancelled(
    world: World,
) -> None:
    """Replaced by a new generation: out of the route at once, cancelled DRAIN_S later,
    so that the requests already sent to it are answered."""
    world.apply(replicas={"min": 1, "max": 1})
    world.step()
    world.run_all()
    world.step()
    [old] = world.live()
    world.apply(replicas={"min": 1, "max": 1}, health={"path": "/v2"})
    world.step()
    [new] = [r for r in world.live() if r["generation"] == 2]
    world.move(new["job"], JobState.RUNNING)
    service = world.step()
    [draining] = [r for r in service["replicas"] if r["job"] == old["job"]]
    assert draining["retired"] and not draining["ready"] and draining["state"] == "running"
    route = Services.route_of(world.sessions, "t", "web")
    assert route is not None and route.ports == (int(new["env"]["PORT"]),)
    service = world.step(DRAIN_S / 2)  # still answering what it was sent
    assert {r["job"]: r["state"] for r in service["replicas"]}[old["job"]] == "running"
    service = world.step(DRAIN_S / 2)
    assert {r["job"]: r["state"] for r in service["replicas"]}[old["job"]] == "cancelled"
    with world.sessions() as db:
        [cancelled] = [e for e in events_for(db, old["job"]) if e.to_state == "cancelled"]
    assert "replaced by generation 2" in (cancelled.message or "")


def test_an_update_the_old_replicas_leave_no_room_for_stops_one_old_replica(
    world: World,
) -> None:
    world.apply(replicas={"min": 2, "max": 2})
    world.step()
    world.run_all()
    world.step()
    world.apply(replicas={"min": 2, "max": 2}, health={"path": "/v2"})
    world.step()  # two new replicas, waiting
    with world.sessions.begin() as db:
        for record in world.live():
            if record["generation"] == 2:
                job = db.get(Job, record["job"])
                assert job is not None
                job.reason_code = "quota_exhausted"
    service = world.step()
    retired = [r for r in service["replicas"] if r.get("retired")]
    assert len(retired) == 1  # room for one new replica, the other old one still serves
    service = world.step()
    assert len([r for r in service["replicas"] if r.get("retired")]) == 1  # one at a time


def test_deleting_a_service_cancels_its_replicas(world: World) -> None:
    world.apply(replicas={"min": 2, "max": 2})
    world.step()
    world.run_all()
    jobs = [r["job"] for r in world.live()]
    with world.sessions.begin() as db:
        service = service_store.get_service(db, "t", "web", for_update=True)
        service_store.delete_service(db, service, at=world.now, by="u")
    with world.sessions() as db:
        assert {db.get(Job, j).state for j in jobs} == {"cancelled"}  # type: ignore[union-attr]
        assert service_store.find_service(db, "t", "web") is None
    world.controller.step()  # nothing left to do, nothing raised


def _service_id(world: World) -> str:
    with world.sessions() as db:
        found: Service = service_store.get_service(db, "t", "web")
        return found.id


def test_a_service_at_zero_starts_a_replica_for_its_first_request(world: World) -> None:
    world.apply(replicas={"min": 0, "max": 2}, autoscaling={"scale_down_delay": "10s"})
    service = world.step()
    assert service["desired"] == 0 and service["replicas"] == []
    world.traffic.begin(_service_id(world))  # a request waits at the proxy
    service = world.step(1.0)
    assert service["desired"] == 1 and len(world.live()) == 1
    world.traffic.end(_service_id(world))
    assert world.step(5.0)["desired"] == 1
    assert world.step(20.0)["desired"] == 0 and world.live() == []


def test_a_preempted_replica_takes_no_traffic_until_it_runs_again(world: World) -> None:
    world.apply(replicas={"min": 1, "max": 1})
    world.step()
    world.run_all()
    [record] = world.step()["replicas"]
    assert record["ready"]
    world.move(record["job"], JobState.PENDING)  # preempted, requeued by the loop
    [record] = world.step()["replicas"]
    assert not record["ready"] and record["state"] == "pending"
    assert Services.route_of(world.sessions, "t", "web").ports == ()  # type: ignore[union-attr]
    world.move(record["job"], JobState.RUNNING)
    [record] = world.step()["replicas"]
    assert record["ready"]
    assert world.service()["restarts"] == 0
