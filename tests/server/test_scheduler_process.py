"""``allot up --scheduler-process``: the scheduler (leader election, control loop,
upkeep) in a process of its own on the same store, woken by the API's messages."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import psutil
import pytest

from allotment.control.services import ServiceTraffic
from allotment.control.wake import WakeListener, WakeSender
from allotment.host import ForwardedTraffic, follow_commands
from allotment.server import spare_core
from tests.server.conftest import EXAMPLES, Up
from tests.server.test_up import JOB, wait_state


def _is_scheduler(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE and "allotment.host" in " ".join(
            process.cmdline()
        )
    except psutil.Error:  # gone, or a zombie by now
        return False


def scheduler_pid(up: Up) -> int:
    assert up.process is not None
    found = [c.pid for c in psutil.Process(up.process.pid).children() if _is_scheduler(c)]
    assert len(found) == 1, found
    return found[0]


def gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_submission_wakes_the_scheduler_in_its_own_process(up: Up) -> None:
    """With a 30 s tick, only the API's message can start the job within seconds."""
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), "--scheduler-process", "--tick", "30")
    pid = scheduler_pid(up)
    # Its settings came down its standard input: the store's URL (a password, with
    # PostgreSQL) is not on a command line that every local user can read.
    assert "allotment.db" not in " ".join(psutil.Process(pid).cmdline())
    time.sleep(1.0)  # the first turns are behind it
    with up.client() as client:
        job = client.submit(JOB)
    started = {"starting", "running", "succeeded"}  # admitted and launched
    assert wait_state(up, job["id"], started, timeout=15) in started
    psutil.Process(pid).send_signal(signal.SIGINT)  # Ctrl-C reaches the whole group
    time.sleep(0.5)
    assert scheduler_pid(up) == pid  # only the API's process decides when it ends
    status, err = up.stop()
    assert status in (0, -signal.SIGTERM) and "Traceback" not in err
    assert f"running in a process of its own (pid {pid})" in err
    assert gone(pid)


def test_the_scheduler_runs_in_a_process_of_its_own_by_default_where_cores_allow(
    up: Up,
) -> None:
    """No flag: a process of its own where ``allot up`` may use two cores or more, else
    a thread beside the API; ``--scheduler-thread`` keeps it beside the API anyway."""
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"))
    with up.client() as client:
        job = client.submit(JOB)
    assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"
    if spare_core():
        pid = scheduler_pid(up)
        status, err = up.stop()
        assert f"scheduler: running in a process of its own (pid {pid})" in err
        assert gone(pid)
    else:
        status, err = up.stop()
        assert "scheduler: running here" in err
    assert status in (0, -signal.SIGTERM) and "Traceback" not in err

    up.start("--scheduler-thread")
    assert up.process is not None
    assert not [c for c in psutil.Process(up.process.pid).children() if _is_scheduler(c)]
    with up.client() as client:
        job = client.submit(JOB)
    assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"
    status, err = up.stop()
    assert "scheduler: running here" in err and "Traceback" not in err


def test_spare_core_follows_the_cores_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert not spare_core()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    assert spare_core()


def test_a_configuration_applied_through_the_api_reaches_the_scheduler_process(
    up: Up,
) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), "--scheduler-process")
    text = (EXAMPLES / "cluster-local.yaml").read_text()
    text += "  - name: newcomers\n    tenant: me\n    quota: {local: {gpu: 1}}\n"
    with up.client() as client:
        assert client.apply_cluster(text)["applied"]
        job = client.submit(JOB.replace("queue: default", "queue: newcomers"))
    assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"


def test_the_scheduler_process_ends_with_a_killed_server_and_a_new_one_leads(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), "--scheduler-process")
    pid = scheduler_pid(up)
    assert up.process is not None
    up.process.send_signal(signal.SIGKILL)
    up.process.wait(timeout=10)
    assert gone(pid)  # its standard input closed: it stopped, and the leader lock is free
    up.start("--scheduler-process")
    with up.client() as client:
        job = client.submit(JOB)
    assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"


def test_a_listener_that_never_started_stops_cleanly() -> None:
    """As when a server fails to open after its scheduler's side was built."""
    listener = WakeListener(lambda kind, words: None)
    listener.stop()


def test_messages_without_the_listeners_secret_are_ignored() -> None:
    got: list[tuple[str, list[str]]] = []
    listener = WakeListener(lambda kind, words: got.append((kind, words)))
    listener.start()
    try:
        WakeSender(listener.port, "not-the-secret").wake()
        WakeSender(listener.port, listener.secret).send("begin", "svc-1")
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert got == [("begin", ["svc-1"])]
    finally:
        listener.stop()


def test_the_scheduler_process_tells_the_api_process_of_each_alert_at_once() -> None:
    """Its standard input says where (``alerts PORT SECRET``); each alert its upkeep
    raises is then an ``alert`` message there, which wakes webhook delivery."""
    woken: list[str] = []
    listener = WakeListener(lambda kind, words: woken.append(kind))
    listener.start()
    try:
        host = SimpleNamespace(on_alert=None)
        follow_commands(
            host,  # type: ignore[arg-type]
            iter([f"alerts {listener.port} {listener.secret}\n", "stop\n", "alerts 1 x\n"]),
        )
        assert host.on_alert is not None  # and the line after "stop" was not read
        host.on_alert()
        deadline = time.monotonic() + 5
        while not woken and time.monotonic() < deadline:
            time.sleep(0.01)
        assert woken == ["alert"]
    finally:
        listener.stop()


def test_the_proxys_request_counts_reach_the_other_process() -> None:
    """What the service controller reads there follows the proxy's counts here."""
    there = ServiceTraffic()
    handlers = {"begin": there.begin, "end": there.end}
    listener = WakeListener(lambda kind, words: handlers[kind](words[0]))
    listener.start()
    try:
        here = ForwardedTraffic()
        here.sender = WakeSender(listener.port, listener.secret)
        here.begin("svc-1")
        here.begin("svc-1")
        here.end("svc-1")
        deadline = time.monotonic() + 5
        while there.take("svc-1")[2] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert there.take("svc-1")[2] == 1 == here.take("svc-1")[2]
    finally:
        listener.stop()


def test_a_scheduler_process_that_dies_is_started_again(up: Up) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), "--scheduler-process")
    first = scheduler_pid(up)
    psutil.Process(first).kill()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            again = scheduler_pid(up)
        except AssertionError:  # between the two
            again = first
        if again != first:
            break
        time.sleep(0.2)
    assert again != first
    with up.client() as client:
        job = client.submit(JOB)
    assert wait_state(up, job["id"], {"succeeded", "failed"}) == "succeeded"
    status, err = up.stop()
    assert status in (0, -signal.SIGTERM)
    assert "the scheduler's process ended" in err and "starting it again" in err


def test_a_lost_message_is_corrected_by_the_levels_sent_every_second() -> None:
    there = ServiceTraffic()
    listener = WakeListener(
        lambda kind, words: (
            there.level(words[0], int(words[1])) if kind == "level" else there.begin(words[0])
        )
    )
    listener.start()
    try:
        here = ForwardedTraffic()
        sender = here.sender = WakeSender(listener.port, listener.secret)
        here.begin("svc-1")
        here.sender = None  # the "end" is lost
        here.end("svc-1")
        here.sender = sender
        deadline = time.monotonic() + 5
        while there.take("svc-1")[2] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert there.take("svc-1")[2] == 1  # wrong until the levels come
        here.resend()
        while there.take("svc-1")[2] != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert there.take("svc-1")[2] == 0 == here.take("svc-1")[2]
    finally:
        listener.stop()
