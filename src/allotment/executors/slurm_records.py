"""What the Slurm executor remembers of each attempt it submitted, on disk.

One JSON file per attempt under the executor's state directory: the Slurm job id, the
replica keys, the attempt's Slurm directory (where the batch script writes its result)
and, once known, how it ended. Slurm forgets ended jobs after ``MinJobAge``; these
records let a server that was down longer still learn how its jobs ended (from the
record, else from the result file the batch script left), and they name the one Slurm
job that belongs to an attempt, so a job someone else submitted with a look-alike name
or comment is never taken for it.

A container attempt's launchers also leave what only they see beside the result: an
``image-error`` file (a missing image, a container Podman could not create) and an
``oom`` file (an OOM kill); :func:`with_markers` reads them into the attempt's status.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from allotment.executors.base import ReplicaKey, ReplicaPhase, ReplicaStatus

RESULT_FILE = "result"
"""Written by the batch script when ``srun`` returns: ``<exit code> <start> <end>``."""
IMAGE_ERROR_FILE = "image-error"
"""Written by a container attempt's launcher when its image is missing or Podman could
not create or start a container: what went wrong (failure class ``image``)."""
OOM_FILE = "oom"
"""Written by a container attempt's launcher when the kernel's OOM killer ended one of
its containers."""
STOP_FILE = "stop"
"""Written by the executor before it signals a container attempt to stop: the grace
period in seconds, after which the launcher removes the containers."""


@dataclass(frozen=True, slots=True)
class Record:
    job_id: str
    attempt: int
    slurm_id: int
    keys: tuple[ReplicaKey, ...]
    slurm_dir: str | None
    submitted_at: float
    final: ReplicaStatus | None = None
    """How the attempt ended, once seen."""
    final_seen_at: float | None = None

    def ended(self, status: ReplicaStatus, at: float) -> Record:
        return replace(self, final=status, final_seen_at=at)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "slurm_id": self.slurm_id,
            "keys": [[k.replica, k.index] for k in self.keys],
            "slurm_dir": self.slurm_dir,
            "submitted_at": self.submitted_at,
            "final": None if self.final is None else asdict(self.final),
            "final_seen_at": self.final_seen_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        job_id, attempt = str(data["job_id"]), int(data["attempt"])
        final = data.get("final")
        status = None
        if isinstance(final, dict):
            status = ReplicaStatus(**{**final, "phase": ReplicaPhase(final["phase"])})
        return cls(
            job_id=job_id,
            attempt=attempt,
            slurm_id=int(data["slurm_id"]),
            keys=tuple(ReplicaKey(job_id, attempt, str(r), int(i)) for r, i in data["keys"]),
            slurm_dir=data.get("slurm_dir"),
            submitted_at=float(data["submitted_at"]),
            final=status,
            final_seen_at=data.get("final_seen_at"),
        )


def result_status(slurm_dir: str | None, slurm_id: int) -> ReplicaStatus | None:
    """How the batch script said the attempt ended, when it lived to say it."""
    if slurm_dir is None:
        return None
    try:
        words = (Path(slurm_dir) / RESULT_FILE).read_text().split()
        code, start, end = int(words[0]), float(words[1]), float(words[2])
    except (OSError, ValueError, IndexError):
        return None
    detail = f"Slurm job {slurm_id} ended while Allotment was away; its batch script exited {code}"
    return ReplicaStatus(
        phase=ReplicaPhase.EXITED,
        exit_code=code,
        started_at=start,
        ended_at=end,
        detail=detail,
    )


def image_error(slurm_dir: str | None) -> str | None:
    """What the launcher said of a missing image or a container that could not start
    (``None``: nothing)."""
    if slurm_dir is None:
        return None
    try:
        text = (Path(slurm_dir) / IMAGE_ERROR_FILE).read_text(errors="replace")
    except OSError:
        return None
    return text.strip() or "the container could not be created or started"


def with_markers(status: ReplicaStatus, slurm_dir: str | None) -> ReplicaStatus:
    """An ended container attempt's ``status`` with what its launcher left beside the
    result: an image error (failure class ``image``) and OOM kills."""
    if slurm_dir is None or not status.ended:
        return status
    problem = image_error(slurm_dir)
    if problem is not None:
        status = replace(status, image_error=True, detail=problem)
    if (Path(slurm_dir) / OOM_FILE).exists():
        status = replace(status, oom=True)
    return status


class Records:
    """The records of one state directory (created mode 0700)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.by_attempt: dict[tuple[str, int], Record] = {}
        for path in sorted(self.root.glob("*.json")):
            try:
                record = Record.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # half-written by a crash: Slurm's own listing is asked instead
            self.by_attempt[(record.job_id, record.attempt)] = record

    def _path(self, job_id: str, attempt: int) -> Path:
        return self.root / f"{quote(job_id, safe='')}-{attempt}.json"

    def get(self, job_id: str, attempt: int) -> Record | None:
        return self.by_attempt.get((job_id, attempt))

    def put(self, record: Record) -> None:
        """Keep ``record`` (written atomically)."""
        path = self._path(record.job_id, record.attempt)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record.to_json()))
        temporary.replace(path)
        self.by_attempt[(record.job_id, record.attempt)] = record

    def drop(self, record: Record) -> None:
        self.by_attempt.pop((record.job_id, record.attempt), None)
        with contextlib.suppress(FileNotFoundError):
            self._path(record.job_id, record.attempt).unlink()

    def all(self) -> list[Record]:
        return list(self.by_attempt.values())
