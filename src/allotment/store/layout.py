"""Where an attempt's files live under the work root, for the loop and the API alike.

``work_root/<tenant>/<job>/<attempt>/`` is the attempt's working directory; its replicas
write ``logs/<replica>-<index>.out`` and ``.err`` there. Tenant, job id and replica name
are percent-quoted (and ``.`` too), so no name can step outside its own directory. The
loop creates these directories with :func:`make_private` (mode ``0o700``): one tenant's
files sit apart from another's, readable by the server's user alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import quote

Stream = Literal["out", "err"]
STREAMS: tuple[Stream, ...] = ("out", "err")
LOGS = "logs"
PRIVATE = 0o700


def segment(name: str) -> str:
    """``name`` as one safe path segment: no separator, never ``.`` or ``..``."""
    return quote(name, safe="").replace(".", "%2E")


def tenant_dir(work_root: Path, tenant: str) -> Path:
    """The root of one tenant's files."""
    return Path(work_root) / segment(tenant)


def job_dir(work_root: Path, tenant: str, job_id: str) -> Path:
    return tenant_dir(work_root, tenant) / segment(job_id)


def attempt_dir(work_root: Path, tenant: str, job_id: str, attempt: int) -> Path:
    """The attempt's working directory."""
    return job_dir(work_root, tenant, job_id) / str(int(attempt))


def logs_dir(work_root: Path, tenant: str, job_id: str, attempt: int) -> Path:
    """The directory holding the attempt's replica logs."""
    return attempt_dir(work_root, tenant, job_id, attempt) / LOGS


def replica_name(replica: str, index: int) -> str:
    """``worker-0``: how logs and the API name one replica."""
    return f"{replica}-{int(index)}"


def log_path(
    work_root: Path,
    tenant: str,
    job_id: str,
    attempt: int,
    replica: str,
    index: int,
    stream: Stream,
) -> Path:
    """The file one replica's ``stream`` (``out`` or ``err``) is written to."""
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}")
    name = f"{segment(replica_name(replica, index))}.{stream}"
    return logs_dir(work_root, tenant, job_id, attempt) / name


def make_private(work_root: Path, directory: Path) -> None:
    """Create ``directory`` (below ``work_root``) and every missing directory between,
    ``work_root`` included, with mode ``0o700``. Raises ``OSError``.

    The walk goes up from ``directory`` to the deepest level that exists (at a new
    attempt, its job's or its tenant's; for a gang's second replica, ``directory``
    itself), then creates the missing levels downwards: the levels above are not looked
    at again for every launch. Existing directories keep their mode."""
    root = Path(work_root)
    current = Path(directory)
    current.relative_to(root)  # raises ValueError outside the root
    missing: list[Path] = []
    while not current.is_dir():
        missing.append(current)
        if current == root:
            break
        current = current.parent
    for path in reversed(missing):
        path.mkdir(mode=PRIVATE, exist_ok=True)
        path.chmod(PRIVATE)  # mkdir's mode is masked by the umask
