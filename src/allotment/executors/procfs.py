"""This machine's processes as ``/proc`` shows them: parentage, process group, CPU time
and resident memory. Linux only; elsewhere every function returns nothing."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessInfo:
    """One process: ``cpu_s`` is user plus system time in seconds; ``rss`` in bytes;
    ``started`` is when it started, in clock ticks since boot (with the pid, what tells
    a process from a later one that reuses its pid)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    cpu_s: float
    rss: int
    started: int = 0


def read_process(pid: int, proc: Path = PROC) -> ProcessInfo | None:
    """``pid``'s entry, or ``None`` when it is gone or unreadable."""
    try:
        stat = (proc / str(pid) / "stat").read_text(encoding="utf-8")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    try:
        return ProcessInfo(
            pid=pid,
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            sid=int(fields[3]),
            cpu_s=(int(fields[11]) + int(fields[12])) / _TICKS,
            rss=int(fields[21]) * _PAGE,
            started=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def process_table(proc: Path = PROC) -> dict[int, ProcessInfo]:
    """Every process readable now, by pid."""
    table: dict[int, ProcessInfo] = {}
    try:
        names = [entry.name for entry in Path(proc).iterdir()]
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            info = read_process(int(name), proc)
            if info is not None:
                table[info.pid] = info
    return table


def members(table: Mapping[int, ProcessInfo], roots: Iterable[int], pgid: int | None) -> set[int]:
    """The processes of one replica: those in process group ``pgid`` and every
    descendant of ``roots`` (a child that left the group still counts)."""
    found = {p.pid for p in table.values() if pgid is not None and p.pgid == pgid}
    found.update(r for r in roots if r in table)
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def environment(pid: int, proc: Path = PROC) -> dict[str, str] | None:
    """``pid``'s environment as it started, or ``None`` when unreadable (another user's
    process, or gone)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def started(pid: int, proc: Path = PROC) -> int | None:
    """When ``pid`` started (clock ticks since boot), or ``None`` when it is gone."""
    info = read_process(pid, proc)
    return info.started if info is not None else None


def survivors(table: Mapping[int, ProcessInfo], pgid: int, leader_started: int | None) -> set[int]:
    """The processes left of the process group ``pgid`` whose leader started at
    ``leader_started``. A live process with the leader's pid but another start time
    means the group is gone and its number reused: nothing is left of it then. (While
    any member lives, Linux never gives the group's number to a new process.)"""
    leader = table.get(pgid)
    if leader is not None and leader_started is not None and leader.started != leader_started:
        return set()
    return {p.pid for p in table.values() if p.pgid == pgid}
