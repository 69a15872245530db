"""What the campaigns' jobs really ran, and the figures drawn from it.

Every job runs :data:`RECORDER`: it writes, and rewrites every 0.1 s, a record of its
job, attempt, process id, ``CUDA_VISIBLE_DEVICES`` and the time it started and was last
seen alive. From the records and the store the campaign counts:

* ``acknowledged``: submissions the server answered with a job;
* ``lost``: acknowledged jobs the store no longer has, or that it calls succeeded
  although no run of theirs finished;
* ``duplicated``: submissions stored twice (one name, two jobs);
* ``double_run``: jobs that ran twice at once (two runs of one attempt, or runs of two
  attempts alive at the same time);
* ``double_booked_device_s``: seconds during which one device was held by two runs.

All four are 0 when the promises hold.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORDER = """
import json, os, sys, time
out, seconds = sys.argv[1], float(sys.argv[2])
job, attempt = os.environ["ALLOTMENT_JOB_ID"], int(os.environ["ALLOTMENT_ATTEMPT"])
path = os.path.join(out, f"{job}.{attempt}.{os.getpid()}.json")
record = {"job": job, "attempt": attempt, "pid": os.getpid(), "start": time.time(),
          "devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
def save(done):
    record["last"], record["done"] = time.time(), done
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
save(False)
end = record["start"] + seconds
while time.time() < end:
    time.sleep(max(0.0, min(0.1, end - time.time())))
    save(False)
save(True)
"""

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def job_text(name: str, records: Path, seconds: float, *, gpus: int = 1) -> str:
    """A job of one replica on ``gpus`` GPUs that records its run for ``seconds``."""
    return json.dumps(
        {
            "name": name,
            "queue": "default",
            "replicas": [{"count": 1, "resources": {"gpu": gpus, "cpu": 1, "memory": "1Gi"}}],
            "command": ["python3", "-c", RECORDER, str(records), f"{seconds:.3f}"],
        }
    )


@dataclass(frozen=True)
class Run:
    job: str
    attempt: int
    pid: int
    devices: tuple[str, ...]
    start: float
    last: float
    done: bool


def read_runs(records: Path) -> list[Run]:
    runs = []
    for path in records.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        runs.append(
            Run(
                job=data["job"],
                attempt=int(data["attempt"]),
                pid=int(data["pid"]),
                devices=tuple(d for d in str(data["devices"]).split(",") if d),
                start=float(data["start"]),
                last=float(data["last"]),
                done=bool(data["done"]),
            )
        )
    return runs


def _overlap(a: Run, b: Run) -> float:
    return max(0.0, min(a.last, b.last) - max(a.start, b.start))


def double_booked_seconds(runs: Iterable[Run]) -> float:
    """Seconds during which a device was held by two runs at once, summed over devices."""
    by_device: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        for device in run.devices:
            by_device[device].append(run)
    total = 0.0
    for held in by_device.values():
        held.sort(key=lambda r: r.start)
        for i, a in enumerate(held):
            for b in held[i + 1 :]:
                if b.start >= a.last:
                    break
                total += _overlap(a, b)
    return total


def double_runs(runs: Iterable[Run]) -> list[str]:
    """Jobs that ran twice at once: one attempt run by two processes, or two attempts
    alive at the same time."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    twice = []
    for job, mine in by_job.items():
        attempts = Counter(r.attempt for r in mine)
        overlapping = any(_overlap(a, b) > 0 for i, a in enumerate(mine) for b in mine[i + 1 :])
        if overlapping or any(n > 1 for n in attempts.values()):
            twice.append(job)
    return sorted(twice)


@dataclass
class Figures:
    """One campaign's outcome."""

    campaign: str
    store: str
    seconds: float = 0.0
    faults: int = 0
    """Faults injected (server kills, lock connections cut, supervisors killed)."""
    acknowledged: int = 0
    unanswered: int = 0
    """Submissions that got no answer at first and were sent again with their key."""
    lost: int = 0
    duplicated: int = 0
    double_run: int = 0
    double_booked_device_s: float = 0.0
    stuck: int = 0
    """Acknowledged jobs not ended when the campaign stopped waiting."""
    retried: int = 0
    """Jobs that needed a second attempt."""
    server_errors: int = 0
    """Answers of 500 or more."""
    bad_answers: int = 0
    """Bad requests answered with anything but a 4xx."""
    jobs_may_fail: bool = False
    """Whether the faults hit jobs themselves (supervisor kills); otherwise every
    acknowledged job must succeed at its first attempt."""
    leaderships: int = 0
    """Times a server took the lead (failover)."""
    states: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing lost, stored twice, run twice or double-booked; nothing stuck; no 5xx
        and every bad request refused; and, unless the faults hit jobs, every job
        succeeded at its first attempt."""
        hurt = not self.jobs_may_fail and (
            self.retried or self.states.get("succeeded", 0) != self.acknowledged
        )
        return not (
            hurt
            or self.lost
            or self.duplicated
            or self.double_run
            or self.double_booked_device_s
            or self.stuck
            or self.server_errors
            or self.bad_answers
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


def tally(
    figures: Figures,
    acknowledged: Mapping[str, str],
    stored: Iterable[Mapping[str, Any]],
    runs: list[Run],
) -> Figures:
    """Fill ``figures`` from the acknowledged submissions (name to job id), every job
    the store lists at the end and the runs recorded."""
    jobs = list(stored)
    by_id = {j["id"]: j for j in jobs}
    names = Counter(j["name"] for j in jobs)
    finished = {r.job for r in runs if r.done}
    figures.acknowledged = len(acknowledged)
    figures.duplicated = sum(n - 1 for n in names.values() if n > 1)
    lost = [
        job_id
        for job_id in acknowledged.values()
        if job_id not in by_id or (by_id[job_id]["state"] == "succeeded" and job_id not in finished)
    ]
    figures.lost = len(lost)
    figures.stuck = sum(
        1 for j in acknowledged.values() if j in by_id and by_id[j]["state"] not in TERMINAL
    )
    figures.double_run = len(double_runs(runs))
    figures.double_booked_device_s = round(double_booked_seconds(runs), 3)
    figures.retried = sum(1 for j in jobs if int(j.get("attempt") or 1) > 1)
    figures.states = dict(Counter(j["state"] for j in jobs))
    figures.failures = dict(
        Counter(str(j.get("failure_class")) for j in jobs if j["state"] == "failed")
    )
    if lost:
        figures.notes.append(f"lost: {', '.join(sorted(lost)[:5])}")
    return figures
