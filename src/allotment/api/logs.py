"""Reading replica logs for the API, confined to the job's own logs directory."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session as DbSession

from allotment.api import schemas
from allotment.domain.errors import AllotmentError, NotFound
from allotment.domain.lifecycle import WAITING, JobState
from allotment.store.allocations import placements_from_json
from allotment.store.jobs import get_job
from allotment.store.layout import Stream, log_path, logs_dir, replica_name
from allotment.store.models import Attempt

MAX_CHUNK = 1024 * 1024
"""Most bytes one request returns."""


class LogsUnavailable(AllotmentError):
    """This server keeps no logs (it was started without a work directory)."""

    code = "logs_unavailable"


def read_log(
    db: DbSession,
    work_root: Path | None,
    job_id: str,
    *,
    attempt: int | None,
    replica: str | None,
    stream: Stream,
    offset: int,
    limit: int,
    from_end: bool = False,
) -> schemas.LogChunk:
    """Up to ``limit`` bytes of one replica's ``stream`` from ``offset`` (with
    ``from_end``, from ``offset`` bytes before its end: its tail, starting at a whole
    character).

    ``attempt`` defaults to the latest, ``replica`` to the attempt's first. A job that
    has not started yet answers no data (``attempt`` 0; ``eof`` once it ended). Raises
    ``NotFound`` for an unknown job, attempt or replica (the replicas in ``fields``)."""
    job = get_job(db, job_id)
    number = job.attempt if attempt is None else attempt
    if number == 0 and attempt is None:  # never started: over once it has ended
        return schemas.LogChunk(
            job=job.id,
            attempt=0,
            replica=replica,
            stream=stream,
            replicas=[],
            offset=offset,
            next_offset=offset,
            data="",
            eof=JobState(job.state) not in WAITING,
        )
    row = db.get(Attempt, (job.id, number))
    if row is None:
        error = NotFound("attempt", str(number))
        error.fields["attempts"] = list(range(1, job.attempt + 1))
        raise error
    placements = placements_from_json(row.allocation)
    names = [replica_name(p.group, p.index) for p in placements]
    chosen = replica if replica is not None else (names[0] if names else None)
    found = next((p for p in placements if replica_name(p.group, p.index) == chosen), None)
    if found is None or chosen is None:
        error = NotFound("replica", str(chosen), known=names)
        error.fields["replicas"] = names
        raise error
    ended = row.end_time is not None or number < job.attempt
    if work_root is None:
        raise LogsUnavailable("this server keeps no logs: it was started without a work root")
    root = Path(work_root).resolve()
    where = (root, job.tenant, job.id, number)
    # No link anywhere on the way: a container owns its working directory (the logs
    # directory's parent) and could put a link to another tenant's logs in its place.
    expected = log_path(*where, found.group, found.index, stream)
    path = expected.resolve()
    if path != expected or logs_dir(*where).resolve() != logs_dir(*where):
        raise NotFound("log", f"{chosen}.{stream}")
    data = b""
    size = 0
    if path.is_file():
        with path.open("rb") as file:
            size = file.seek(0, 2)
            if from_end:
                offset = max(0, size - offset)
            if offset < size:
                file.seek(offset)
                data = file.read(min(limit, MAX_CHUNK))
            while from_end and data and data[0] & 0xC0 == 0x80:  # inside a character
                data, offset = data[1:], offset + 1
    text, used = _decode(data, final=ended and offset + len(data) >= size)
    next_offset = offset + used
    return schemas.LogChunk(
        job=job.id,
        attempt=number,
        replica=chosen,
        stream=stream,
        replicas=names,
        offset=offset,
        next_offset=next_offset,
        data=text,
        eof=ended and next_offset >= size,
    )


def _decode(data: bytes, *, final: bool) -> tuple[str, int]:
    """UTF-8 text of ``data`` and how many bytes it used: a character cut at the end
    of the chunk is left for the next read, unless nothing more will come."""
    if not final:
        for cut in range(4):
            head = data[: len(data) - cut]
            try:
                return head.decode("utf-8"), len(head)
            except UnicodeDecodeError:
                continue
    return data.decode("utf-8", errors="replace"), len(data)
