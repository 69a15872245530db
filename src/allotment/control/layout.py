"""Where an attempt's files live under the work root, for the loop and the API alike.

``work_root/<job>/<attempt>/`` is the attempt's working directory; its replicas write
``logs/<replica>-<index>.out`` and ``.err`` there. The job id and the replica name are
percent-quoted (and ``.`` too), so no name can step outside its own directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import quote

Stream = Literal["out", "err"]
STREAMS: tuple[Stream, ...] = ("out", "err")
LOGS = "logs"


def segment(name: str) -> str:
    """``name`` as one safe path segment: no separator, never ``.`` or ``..``."""
    return quote(name, safe="").replace(".", "%2E")


def job_dir(work_root: Path, job_id: str) -> Path:
    return Path(work_root) / segment(job_id)


def attempt_dir(work_root: Path, job_id: str, attempt: int) -> Path:
    """The attempt's working directory."""
    return job_dir(work_root, job_id) / str(int(attempt))


def logs_dir(work_root: Path, job_id: str, attempt: int) -> Path:
    """The directory holding the attempt's replica logs."""
    return attempt_dir(work_root, job_id, attempt) / LOGS


def replica_name(replica: str, index: int) -> str:
    """``worker-0``: how logs and the API name one replica."""
    return f"{replica}-{int(index)}"


def log_path(
    work_root: Path, job_id: str, attempt: int, replica: str, index: int, stream: Stream
) -> Path:
    """The file one replica's ``stream`` (``out`` or ``err``) is written to."""
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}")
    name = f"{segment(replica_name(replica, index))}.{stream}"
    return logs_dir(work_root, job_id, attempt) / name
