"""The reliability campaigns: faults injected into real ``allot up`` servers while
clients submit, and the figures of :mod:`bench.reliability.runs` at the end.

* ``crash_loop``: the server is SIGKILLed at random moments and started again, while a
  client submits jobs (sending a submission that got no answer again, with its key).
* ``launch_window``: bursts of short jobs, the server killed within a second of each
  burst, while it admits and launches them.
* ``supervisor_kills``: random replicas' supervisors are SIGKILLed; their replicas must
  be stopped before their GPUs are given again, and the job retried once.
* ``failover`` (PostgreSQL): two servers on one store; the leader's advisory-lock
  connection is terminated again and again, so leadership moves under load.
* ``bad_input``: :data:`bench.reliability.bad_input.BAD_REQUESTS`, each of which must be
  a 4xx that stores nothing.

Each takes a directory of its own, a store (``sqlite`` or ``postgresql``), a duration
and a seed, and returns :class:`Figures`.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.reliability.bad_input import send_all
from bench.reliability.deploy import (
    Deployment,
    postgres_database,
    terminate_leader_connection,
)
from bench.reliability.runs import TERMINAL, Figures, job_text, read_runs, tally

from allotment.client import ClientError

STORES = ("sqlite", "postgresql")
STALL_S = 30.0
"""How long the backlog may stand still at the end before its jobs count as stuck."""
DRAIN_S = 900.0
"""The longest wait for the backlog at the end."""


@contextlib.contextmanager
def deployment(root: Path, store: str, *, servers: int = 1) -> Iterator[Deployment]:
    """A deployment on a fresh store of kind ``store``, closed (and dropped) after."""
    if store not in STORES:
        raise ValueError(f"store must be one of {', '.join(STORES)}, not {store!r}")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_database()) if store == "postgresql" else None
        deployed = Deployment(root, url, servers)
        stack.callback(deployed.close)
        yield deployed


class Submitter:
    """Submits jobs (alone or in batches), each submission with a key of its own, sent
    again with that key until some server answers; remembers what was acknowledged."""

    def __init__(self, deployed: Deployment, seed: int, durations: tuple[float, float]) -> None:
        self.deployed = deployed
        self.rng = random.Random(seed)
        self.durations = durations
        self.acknowledged: dict[str, str] = {}
        self.unanswered = 0
        self.server_errors: list[str] = []
        self.count = 0
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def texts(self, n: int) -> list[tuple[str, str]]:
        batch = []
        for _ in range(n):
            name = f"c{self.count:05d}"
            self.count += 1
            seconds = self.rng.uniform(*self.durations)
            gpus = self.rng.choice((1, 1, 1, 2))
            batch.append((name, job_text(name, self.deployed.records, seconds, gpus=gpus)))
        return batch

    def send(self, batch: list[tuple[str, str]], *, give_up_s: float = 60.0) -> bool:
        """Submit ``batch`` (one job: ``submit``; several: ``submit_many``) until a
        server answers; whether it was acknowledged."""
        key = uuid.uuid4().hex
        deadline = time.monotonic() + give_up_s
        first = True
        while time.monotonic() < deadline:
            for server in range(len(self.deployed.ports)):
                try:
                    with self.deployed.client(server) as client:
                        if len(batch) == 1:
                            jobs = [client.submit(batch[0][1], idempotency_key=key)]
                        else:
                            texts = [t for _, t in batch]
                            jobs = client.submit_many(texts, idempotency_key=key)
                except ClientError as exc:
                    if exc.status >= 500:
                        self.server_errors.append(f"submit: {exc}")
                    elif exc.status != 0:
                        raise
                    if first:
                        self.unanswered += 1
                        first = False
                    continue
                for (name, _), job in zip(batch, jobs, strict=True):
                    self.acknowledged[name] = job["id"]
                return True
            time.sleep(0.2)
        return False

    def start(self, every: tuple[float, float]) -> None:
        def loop() -> None:
            while not self.stopping.is_set():
                self.send(self.texts(1))
                self.stopping.wait(self.rng.uniform(*every))

        self._thread = threading.Thread(target=loop, name="campaign-submitter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=120)


def list_all(deployed: Deployment) -> list[dict[str, Any]]:
    """Every job the store holds, from the first server that answers."""
    jobs: list[dict[str, Any]] = []
    after: str | None = None
    server = next(i for i in range(len(deployed.ports)) if deployed.alive(i))
    with deployed.client(server, timeout=30) as client:
        while True:
            page = client.list_jobs(limit=500, after=after)
            jobs.extend(page["jobs"])
            after = page["next_after"]
            if after is None:
                return jobs


def finish(deployed: Deployment, figures: Figures, submitter: Submitter, started: float) -> Figures:
    """Stop submitting, start the servers that are down, wait for every acknowledged job
    to end, and count. A job still not ended once nothing has changed for
    :data:`STALL_S` seconds (or after :data:`DRAIN_S`) is stuck."""
    submitter.stop()
    figures.seconds = round(time.monotonic() - started, 1)
    for server in range(len(deployed.ports)):
        if not deployed.alive(server):
            deployed.start(server)
    deadline = time.monotonic() + DRAIN_S
    last: dict[str, str] = {}
    changed = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - changed < STALL_S:
        states = {j["id"]: j["state"] for j in list_all(deployed)}
        if all(states.get(i) in TERMINAL for i in submitter.acknowledged.values()):
            break
        if states != last:
            last, changed = states, time.monotonic()
        time.sleep(0.5)
    time.sleep(0.5)  # the last records are written
    figures.unanswered = submitter.unanswered
    figures.server_errors = len(submitter.server_errors)
    figures.notes.extend(submitter.server_errors[:5])
    return tally(figures, submitter.acknowledged, list_all(deployed), read_runs(deployed.records))


Fault = Callable[[Deployment, Submitter, random.Random, Figures], None]
"""One round of a campaign: inject a fault (or a burst and a fault), counting it."""


def under_load(
    root: Path,
    store: str,
    seconds: float,
    seed: int,
    figures: Figures,
    fault: Fault,
    *,
    durations: tuple[float, float],
    every: tuple[float, float] | None,
    servers: int = 1,
) -> Figures:
    """Start ``servers`` servers, submit jobs of ``durations`` seconds every ``every``
    seconds (None: only what ``fault`` submits) and run ``fault`` round after round for
    ``seconds``; then :func:`finish`."""
    rng = random.Random(seed)
    with deployment(root, store, servers=servers) as deployed:
        for server in range(servers):
            deployed.start(server)
        submitter = Submitter(deployed, rng.randrange(2**32), durations)
        started = time.monotonic()
        if every is not None:
            submitter.start(every=every)
        while time.monotonic() - started < seconds:
            fault(deployed, submitter, rng, figures)
        if servers > 1:
            figures.leaderships = deployed.leaderships()
        return finish(deployed, figures, submitter, started)


def crash_loop(root: Path, store: str, seconds: float, seed: int = 1) -> Figures:
    """SIGKILL the server every 0.5 to 3 s, down for up to 0.5 s, while jobs of 0.3 to 2 s
    are submitted 3 to 6 times a second."""

    def kill(deployed: Deployment, _: Submitter, rng: random.Random, figures: Figures) -> None:
        time.sleep(rng.uniform(0.5, 3.0))
        deployed.kill()
        figures.faults += 1
        time.sleep(rng.uniform(0.0, 0.5))
        deployed.start()

    figures = Figures("crash_loop", store)
    return under_load(
        root, store, seconds, seed, figures, kill, durations=(0.3, 2.0), every=(0.15, 0.35)
    )


def launch_window(root: Path, store: str, seconds: float, seed: int = 2) -> Figures:
    """Bursts of 3 to 8 jobs of 0.1 to 0.6 s; the server is killed 0 to 0.8 s after each
    burst, while it admits and launches them."""

    def burst_then_kill(
        deployed: Deployment, submitter: Submitter, rng: random.Random, figures: Figures
    ) -> None:
        submitter.send(submitter.texts(rng.randint(3, 8)))
        time.sleep(rng.uniform(0.0, 0.8))
        deployed.kill()
        figures.faults += 1
        deployed.start()

    figures = Figures("launch_window", store)
    return under_load(
        root, store, seconds, seed, figures, burst_then_kill, durations=(0.1, 0.6), every=None
    )


def supervisor_kills(root: Path, store: str, seconds: float, seed: int = 3) -> Figures:
    """SIGKILL a random running replica's supervisor every 0.5 to 2 s, while jobs of
    1.5 to 4 s are submitted about once a second (some 80% of the GPUs). A job so hit is
    retried once."""

    def kill(deployed: Deployment, _: Submitter, rng: random.Random, figures: Figures) -> None:
        time.sleep(rng.uniform(0.5, 2.0))
        supervisors = deployed.supervisors()
        if supervisors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rng.choice(supervisors), signal.SIGKILL)
                figures.faults += 1

    figures = Figures("supervisor_kills", store, jobs_may_fail=True)
    return under_load(
        root, store, seconds, seed, figures, kill, durations=(1.5, 4.0), every=(0.8, 1.4)
    )


def failover(root: Path, store: str, seconds: float, seed: int = 4) -> Figures:
    """Two servers on one PostgreSQL store; every 1.5 to 3.5 s the connection holding the
    leader's advisory lock is terminated, while jobs of 0.3 to 2 s are submitted to either
    server about twice a second (some 80% of the GPUs)."""
    if store != "postgresql":
        raise ValueError("failover needs a shared PostgreSQL store")

    def cut(deployed: Deployment, _: Submitter, rng: random.Random, figures: Figures) -> None:
        time.sleep(rng.uniform(1.5, 3.5))
        assert deployed.db_url is not None
        if terminate_leader_connection(deployed.db_url):
            figures.faults += 1

    figures = Figures("failover", store)
    return under_load(
        root,
        store,
        seconds,
        seed,
        figures,
        cut,
        durations=(0.3, 2.0),
        every=(0.35, 0.6),
        servers=2,
    )


def bad_input(root: Path, store: str, seconds: float = 0.0, seed: int = 0) -> Figures:
    """Every bad request once: ``faults`` is how many were sent, ``bad_answers`` how
    many got anything but a 4xx, ``lost`` how many jobs were stored by them."""
    figures = Figures("bad_input", store)
    with deployment(root, store) as deployed:
        deployed.start()
        started = time.monotonic()
        answers = send_all(deployed.url(), deployed.token())
        figures.seconds = round(time.monotonic() - started, 1)
        figures.faults = len(answers)
        wrong = [a for a in answers if not 400 <= a.status < 500]
        figures.bad_answers = len(wrong)
        figures.server_errors = sum(1 for a in answers if a.status >= 500)
        figures.notes.extend(f"{a.bad.what}: {a.status} {a.body}" for a in wrong)
        stored = list_all(deployed)
        figures.lost = len(stored)  # a bad request that stored a job
        figures.states = {"stored": len(stored)}
        with deployed.client() as client:
            client.list_jobs()  # still serving
        return figures


CAMPAIGNS: dict[str, Callable[[Path, str, float, int], Figures]] = {
    "crash_loop": crash_loop,
    "launch_window": launch_window,
    "supervisor_kills": supervisor_kills,
    "failover": failover,
    "bad_input": bad_input,
}
