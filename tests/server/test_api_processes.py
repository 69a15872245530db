"""``allot up --api-processes N``: the API served by N processes on one port, in step
with each other through the store, a shared file of counters and messages to the
server. Real ``allot up`` processes; one API process at a time is stopped (SIGSTOP) so
that the other takes every connection, which shows what each one serves."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from allotment.api_processes import Relay, SharedCounters
from allotment.client import AllotmentClient, ClientError
from allotment.control.services import ServiceTraffic
from tests.server.conftest import EXAMPLES, Up
from tests.server.test_scheduler_process import gone
from tests.server.test_up import JOB, wait_state

NEW_QUEUE = """
      - name: research
        tenant: me
        quota: {local: {gpu: 0, cpu: 0, memory: 0}}
        default_priority_class: experiment
"""


def api_pids(up: Up, count: int = 2, timeout: float = 20.0) -> list[int]:
    """The server's API processes (uvicorn's workers), once there are ``count``."""
    assert up.process is not None
    deadline = time.monotonic() + timeout
    found: list[int] = []
    while time.monotonic() < deadline:
        found = []
        for child in psutil.Process(up.process.pid).children():
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(
                    child.cmdline()
                ):
                    found.append(child.pid)
        if len(found) == count:
            return sorted(found)
        time.sleep(0.1)
    raise AssertionError(f"API processes: {found}, not {count}")


@contextlib.contextmanager
def only(serving: int, stopped: int) -> Iterator[None]:
    """Only ``serving`` takes connections while the block runs (``stopped`` is paused)."""
    psutil.Process(stopped).suspend()
    psutil.Process(serving).resume()
    try:
        yield
    finally:
        psutil.Process(stopped).resume()


def test_every_api_process_serves_with_the_same_cluster_and_tokens(up: Up) -> None:
    """A configuration applied through one process is in use in the other for the next
    request; a token revoked through one is refused by the other at once, though it
    had just remembered it; a submission to either wakes the scheduler (a 30 s tick)."""
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), "--api-processes", "2", "--tick", "30")
    first, second = api_pids(up)
    time.sleep(1.0)  # the scheduler's first turns are behind it

    for serving, stopped in ((first, second), (second, first)):
        with only(serving, stopped), up.client() as client:
            job = client.submit(JOB)
        started = {"starting", "running", "succeeded"}
        assert wait_state(up, job["id"], started, timeout=15) in started

    with only(first, second), up.client() as client:
        text = client.cluster()["text"] + NEW_QUEUE
        client.apply_cluster(text)
    with only(second, first), up.client() as client:
        job = client.submit(JOB.replace("queue: default", "queue: research"))
        assert job["queue"] == "research"

    with only(second, first), up.client() as client:
        issued = client.create_token(user="me", tenant="me", role="member")
    with only(second, first), AllotmentClient(up.url, issued["token"]) as member:
        assert member.list_jobs() is not None  # remembered by this process now
    with only(first, second), up.client() as client:
        client.revoke_token(issued["id"])
    with only(second, first), AllotmentClient(up.url, issued["token"]) as member:
        try:
            member.list_jobs()
        except ClientError as exc:
            assert exc.status == 401
        else:
            raise AssertionError("a revoked token was still accepted")

    status, err = up.stop()
    assert status in (0, -signal.SIGTERM), (status, err)
    assert "Traceback" not in err and "API:       2 processes" in err
    assert gone(first) and gone(second)


def test_an_api_process_that_ends_is_replaced_and_all_end_with_the_server(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), "--api-processes", "2")
    first, second = api_pids(up)
    psutil.Process(first).kill()
    assert gone(first)
    replaced = api_pids(up, timeout=30)
    assert second in replaced and first not in replaced
    for _ in range(10):  # fresh connections, whichever process takes them
        assert httpx.get(f"{up.url}/api/v1/healthz", timeout=5).status_code == 200
    with up.client() as client:
        job = client.submit(JOB)
    assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"

    assert up.process is not None
    up.process.send_signal(signal.SIGKILL)
    up.process.wait(timeout=10)
    for pid in replaced:
        assert gone(pid)


def test_the_relay_adds_up_each_api_process_s_requests_in_flight() -> None:
    """Each process's last level counts, so one process's level never hides another's;
    begin and end move the sum at once; a process silent for 5 s has ended, and its
    requests are dropped; the other messages go where they belong."""
    traffic = ServiceTraffic()
    calls: list[str] = []
    now = [100.0]
    relay = Relay(
        wake=lambda: calls.append("wake"),
        cluster_changed=lambda: calls.append("cluster"),
        traffic=lambda: traffic,
        monotonic=lambda: now[0],
    )
    relay.listener.start()
    relay.handle("level", ["svc", "3", "101"])
    relay.handle("level", ["svc", "2", "102"])
    assert traffic.levels() == {"svc": 5}
    relay.handle("begin", ["svc", "101"])
    assert traffic.levels() == {"svc": 6}
    relay.handle("level", ["svc", "0", "102"])  # the other process's requests ended
    assert traffic.levels() == {"svc": 4}
    relay.handle("end", ["svc", "101"])
    relay.handle("level", ["svc", "x", "101"])  # not a count: ignored
    assert traffic.levels() == {"svc": 3}
    relay.handle("wake", [])
    relay.handle("cluster", [])
    assert calls == ["wake", "cluster"]
    # Process 101 ends with 3 requests in flight; 102 goes on saying it is alive.
    now[0] += 3.0
    relay.handle("alive", ["102"])
    assert traffic.levels() == {"svc": 3}
    now[0] += 3.0  # 101 silent for 6 s: gone, and its requests with it
    relay.handle("alive", ["102"])
    assert traffic.levels() == {"svc": 0}
    relay.listener.stop()


def test_counters_are_shared_by_every_mapping_of_the_file(tmp_path: Path) -> None:
    one = SharedCounters(tmp_path / "counters")
    other = SharedCounters(tmp_path / "counters")
    assert one.read(SharedCounters.CLUSTER) == other.read(SharedCounters.TOKENS) == 0
    one.bump(SharedCounters.CLUSTER)
    other.bump(SharedCounters.CLUSTER)
    other.bump(SharedCounters.TOKENS)
    assert one.read(SharedCounters.CLUSTER) == 2 and one.read(SharedCounters.TOKENS) == 1
    one.close()
    other.close()
