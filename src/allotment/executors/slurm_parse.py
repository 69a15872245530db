"""Reading Slurm's output: nodes, configuration and jobs, mapped to Allotment's terms.

Pure functions over the text and JSON that ``scontrol`` and ``squeue`` print, so that
every mapping (node health, pool membership, job state → replica status) is tested
without a cluster. The executor (:mod:`allotment.executors.slurm`) runs the commands.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from allotment.domain.cluster import Device, Node
from allotment.domain.executor import SlurmPool, SlurmSettings
from allotment.executors.base import ReplicaKey, ReplicaPhase, ReplicaStatus

JOB_NAME_PREFIX = "allot-"
COMMENT_PREFIX = "allotment "
_COMMENT = re.compile(
    r"^allotment job=(?P<job>\S+) attempt=(?P<attempt>\d+) replicas=(?P<replicas>\S+)$"
)
_REPLICA = re.compile(r"^(?P<group>.+)-(?P<index>\d+)$")

HEALTHY_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "ALLOC", "COMPLETING", "PLANNED"})
"""Node states (and ``+`` flags) under which Allotment places work on a node; any other
state or flag (DOWN, DRAIN, FAIL, MAINT, RESERVED, REBOOT, POWERED_DOWN, …) or the
not-responding mark ``*`` makes the node unhealthy."""

STUCK_REASONS = frozenset(
    {
        "ReqNodeNotAvail",
        "NodeDown",
        "PartitionDown",
        "PartitionInactive",
        "PartitionNodeLimit",
        "PartitionConfig",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "JobHeldAdmin",
        "JobHeldUser",
        "launch failed requeued held",
        "Reservation",
        "BeginTime",
    }
)
"""Pending reasons under which a job pinned to its nodes will not start by itself."""


# ---------------------------------------------------------------- key=value lines


def key_values(line: str) -> dict[str, str]:
    """``scontrol show … -o`` output: ``Key=value`` pairs separated by spaces (values
    may contain spaces only where Slurm writes ``OS=Linux 6.1 …``; those are joined to
    the previous value)."""
    out: dict[str, str] = {}
    last: str | None = None
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_:]*", key):
            out[key] = value
            last = key
        elif last is not None:
            out[last] = f"{out[last]} {word}"
    return out


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Name = value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


# ---------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as ``scontrol show node -o`` describes it."""

    name: str
    cpus: int
    memory_mb: int
    gpus: Mapping[str, int]
    """GRES ``gpu`` counts by type (``""`` for untyped)."""
    features: frozenset[str]
    partitions: frozenset[str]
    state: str
    reason: str = ""
    address: str = ""
    """How other nodes reach it: ``NodeAddr``, else ``NodeHostname``, else its name."""

    @property
    def healthy(self) -> bool:
        if "*" in self.state or "$" in self.state:
            return False
        flags = self.state.replace("*", "").split("+")
        return all(flag in HEALTHY_STATES for flag in flags)


def _gres_gpus(gres: str) -> dict[str, int]:
    """``gpu:a100:4(S:0-1),gpu:h100:2,shard:8`` → ``{"a100": 4, "h100": 2}``."""
    out: dict[str, int] = {}
    for item in gres.split(","):
        item = item.split("(", 1)[0]
        parts = item.split(":")
        if not parts or parts[0] != "gpu":
            continue
        if len(parts) == 2 and parts[1].isdigit():
            kind, count = "", int(parts[1])
        elif len(parts) >= 3 and parts[2].isdigit():
            kind, count = parts[1], int(parts[2])
        else:
            continue
        out[kind] = out.get(kind, 0) + count
    return out


def _words(value: str | None) -> frozenset[str]:
    if not value or value == "(null)":
        return frozenset()
    return frozenset(w for w in value.split(",") if w)


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _address(fields: Mapping[str, str]) -> str | None:
    for key in ("NodeAddr", "NodeHostname"):
        value = fields.get(key, "")
        if value and value != "(null)":
            return value
    return None


def parse_nodes(text: str) -> list[SlurmNode]:
    """Every node of ``scontrol show node -o`` (one per line)."""
    nodes = []
    for line in text.splitlines():
        fields = key_values(line)
        name = fields.get("NodeName")
        if not name:
            continue
        nodes.append(
            SlurmNode(
                name=name,
                cpus=_int(fields.get("CPUEfctv"), _int(fields.get("CPUTot"))),
                memory_mb=_int(fields.get("RealMemory")),
                gpus=_gres_gpus(fields.get("Gres", "")),
                features=_words(fields.get("AvailableFeatures")),
                partitions=_words(fields.get("Partitions")),
                state=fields.get("State", "UNKNOWN"),
                reason=fields.get("Reason", ""),
                address=_address(fields) or name,
            )
        )
    return nodes


def _matches(node: SlurmNode, rule: SlurmPool) -> bool:
    if rule.gres_type is not None and not node.gpus.get(rule.gres_type):
        return False
    if rule.feature is not None and rule.feature not in node.features:
        return False
    return rule.partition is None or rule.partition in node.partitions


def pool_of(node: SlurmNode, settings: SlurmSettings) -> str | None:
    """The first pool whose rule the node matches, ``None`` when it is not Allotment's."""
    for pool, rule in settings.pools.items():
        if _matches(node, rule):
            return pool
    return None


def gres_type_of(node: SlurmNode, settings: SlurmSettings, pool: str) -> str | None:
    """The GRES type to request on ``node`` for ``pool``: the pool's own, else the
    node's only GPU type; ``None`` when the node's GPUs are untyped."""
    rule = settings.pools[pool]
    if rule.gres_type is not None:
        return rule.gres_type
    typed = [kind for kind in node.gpus if kind]
    return typed[0] if len(typed) == 1 else None


def to_nodes(slurm_nodes: Iterable[SlurmNode], settings: SlurmSettings) -> dict[str, Node]:
    """Allotment's nodes for the Slurm nodes that map to a pool."""
    out: dict[str, Node] = {}
    for node in slurm_nodes:
        pool = pool_of(node, settings)
        if pool is None:
            continue
        kind = gres_type_of(node, settings, pool)
        gpus = node.gpus.get(kind or "", 0) if kind is not None else sum(node.gpus.values())
        out[node.name] = Node.model_validate(
            {
                "name": node.name,
                "pool": pool,
                "capacity": {"gpu": gpus, "cpu": node.cpus, "memory": f"{node.memory_mb}Mi"},
                "healthy": node.healthy,
                "devices": [Device(index=i, model=kind) for i in range(gpus)],
            }
        )
    return out


# ---------------------------------------------------------------- configuration


def config_problems(config: Mapping[str, str], partition: Mapping[str, str] | None) -> list[str]:
    """What in Slurm's configuration would let Slurm reorder, preempt, requeue or
    over-commit Allotment's placements; each problem says what to set."""
    problems = []
    preempt = config.get("PreemptType", "preempt/none")
    if preempt != "preempt/none":
        problems.append(
            f"PreemptType is {preempt}: set PreemptType=preempt/none (Allotment decides preemption)"
        )
    select = config.get("SelectType", "")
    if select not in ("select/cons_tres", "select/cons_res"):
        problems.append(
            f"SelectType is {select or 'unset'}: set SelectType=select/cons_tres so that "
            "jobs share nodes by cores and GPUs as Allotment places them"
        )
    age = _int(config.get("MinJobAge", "300").split()[0], 300)
    if age < 30:
        problems.append(
            f"MinJobAge is {age} s: set MinJobAge=300 (at least 30) so that Allotment "
            "sees how each job ended"
        )
    if partition is None:
        problems.append("the partition does not exist: create it or fix executor.slurm.partition")
        return problems
    shared = partition.get("OverSubscribe", "NO")
    if not shared.startswith(("NO", "EXCLUSIVE")):
        problems.append(
            f"partition OverSubscribe is {shared}: set OverSubscribe=NO "
            "(oversubscription double-books GPUs)"
        )
    if partition.get("State", "UP") != "UP":
        problems.append(f"partition State is {partition.get('State')}: set it UP")
    mode = partition.get("PreemptMode", "OFF")
    if mode not in ("OFF", "CANCEL") and preempt != "preempt/none":
        problems.append(f"partition PreemptMode is {mode}: set PreemptMode=OFF")
    return problems


# ---------------------------------------------------------------- jobs


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One of Allotment's jobs in Slurm (others are ignored)."""

    slurm_id: int
    job_id: str
    attempt: int
    keys: tuple[ReplicaKey, ...]
    state: str
    reason: str
    start_time: float | None
    end_time: float | None
    exit_code: int | None
    signal: int | None
    submit_time: float | None
    user_id: int | None = None
    output_dir: str | None = None
    """The folder of the job's output file (the attempt's Slurm directory)."""


def comment_for(job_id: str, attempt: int, keys: Iterable[ReplicaKey]) -> str:
    replicas = ",".join(f"{k.replica}-{k.index}" for k in keys)
    return f"{COMMENT_PREFIX}job={job_id} attempt={attempt} replicas={replicas}"


def job_name(job_id: str, attempt: int) -> str:
    return f"{JOB_NAME_PREFIX}{job_id}-{attempt}"


def _keys_from_comment(comment: str) -> tuple[str, int, tuple[ReplicaKey, ...]] | None:
    match = _COMMENT.match(comment.strip())
    if match is None:
        return None
    job_id, attempt = match["job"], int(match["attempt"])
    keys = []
    for text in match["replicas"].split(","):
        replica = _REPLICA.match(text)
        if replica is None:
            return None
        keys.append(ReplicaKey(job_id, attempt, replica["group"], int(replica["index"])))
    return job_id, attempt, tuple(keys)


def _time(value: Any) -> float | None:
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": N}
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, int | float) and value > 0:
        return float(value)
    return None


def _state(value: Any) -> str:
    if isinstance(value, list):  # newer Slurm: a list of flags, base state first
        return str(value[0]) if value else "UNKNOWN"
    return str(value or "UNKNOWN")


def _exit(value: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) from a job's ``exit_code``: a wait status in 22.05, an object
    ``{"status", "return_code": …, "signal": …}`` in later versions."""
    if isinstance(value, dict):
        code = value.get("return_code")
        sig = value.get("signal", {})
        code = _time(code) if isinstance(code, dict) else code
        number = sig.get("id") if isinstance(sig, dict) else None
        number = _time(number) if isinstance(number, dict) else number
        return (
            int(code) if isinstance(code, int | float) else None,
            int(number) if isinstance(number, int | float) and number else None,
        )
    if isinstance(value, int):
        if value & 0x7F:
            return None, value & 0x7F
        return (value >> 8) & 0xFF, None
    return None, None


def _user(value: Any) -> int | None:
    value = _time(value) if isinstance(value, dict) else value
    return int(value) if isinstance(value, int | float) else None


def _folder(value: Any) -> str | None:
    if not isinstance(value, str) or "/" not in value:
        return None
    return value.rsplit("/", 1)[0] or "/"


def parse_jobs(document: Mapping[str, Any]) -> list[SlurmJob]:
    """Allotment's jobs in ``squeue --json`` output (recognised by their comment)."""
    jobs = []
    for raw in document.get("jobs", []):
        comment = str(raw.get("comment") or "")
        if not comment.startswith(COMMENT_PREFIX):
            continue
        parsed = _keys_from_comment(comment)
        if parsed is None:
            continue
        job_id, attempt, keys = parsed
        code, sig = _exit(raw.get("exit_code"))
        jobs.append(
            SlurmJob(
                slurm_id=int(raw["job_id"]),
                job_id=job_id,
                attempt=attempt,
                keys=keys,
                state=_state(raw.get("job_state")),
                reason=str(raw.get("state_reason") or ""),
                start_time=_time(raw.get("start_time")),
                end_time=_time(raw.get("end_time")),
                exit_code=code,
                signal=sig,
                submit_time=_time(raw.get("submit_time")),
                user_id=_user(raw.get("user_id")),
                output_dir=_folder(raw.get("standard_output")),
            )
        )
    return jobs


_ENDED_AS_LOST = {
    "NODE_FAIL": "a node failed",
    "BOOT_FAIL": "a node failed to boot",
    "PREEMPTED": "Slurm preempted it (set PreemptType=preempt/none)",
    "REQUEUED": "Slurm requeued it",
    "REQUEUE_HOLD": "Slurm requeued and held it",
    "REQUEUE_FED": "Slurm requeued it",
    "REVOKED": "Slurm revoked it",
    "SPECIAL_EXIT": "Slurm held it after a special exit",
}
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING"})
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "RESV_DEL_HOLD"})


def status_of(
    job: SlurmJob, *, now: float, stop_requested: bool, pending_since: float, timeout: float
) -> ReplicaStatus:
    """The status every replica of ``job`` has. A job pending for a reason that will not
    pass by itself, or pending past ``timeout`` since ``pending_since``, is ``lost``
    (the caller cancels it in Slurm)."""
    state = job.state
    if state in PENDING_STATES:
        if job.reason in STUCK_REASONS or now - pending_since > timeout:
            return ReplicaStatus(
                phase=ReplicaPhase.LOST,
                ended_at=now,
                stop_requested=stop_requested,
                detail=f"Slurm job {job.slurm_id} cannot start: {job.reason or 'pending'}",
            )
        return ReplicaStatus(
            phase=ReplicaPhase.STARTING,
            stop_requested=stop_requested,
            detail=f"Slurm job {job.slurm_id} pending: {job.reason}",
        )
    common: dict[str, Any] = {
        "started_at": job.start_time,
        "stop_requested": stop_requested,
    }
    if state in RUNNING_STATES:
        return ReplicaStatus(phase=ReplicaPhase.RUNNING, **common)
    ended = job.end_time or now
    where = f"Slurm job {job.slurm_id} {state}"
    if state == "COMPLETED":
        return ReplicaStatus(phase=ReplicaPhase.EXITED, exit_code=0, ended_at=ended, **common)
    if state == "OUT_OF_MEMORY":
        return ReplicaStatus(
            phase=ReplicaPhase.EXITED,
            exit_code=job.exit_code or 1,
            oom=True,
            ended_at=ended,
            detail=where,
            **common,
        )
    if state in ("TIMEOUT", "DEADLINE"):
        return ReplicaStatus(
            phase=ReplicaPhase.KILLED,
            signal=int(signal.SIGTERM),
            timed_out=True,
            ended_at=ended,
            detail=where,
            **common,
        )
    if state == "FAILED":
        if job.signal is not None:
            return ReplicaStatus(
                phase=ReplicaPhase.KILLED, signal=job.signal, ended_at=ended, detail=where, **common
            )
        return ReplicaStatus(
            phase=ReplicaPhase.EXITED,
            exit_code=job.exit_code if job.exit_code else 1,
            ended_at=ended,
            detail=where,
            **common,
        )
    if state == "CANCELLED" and stop_requested:
        return ReplicaStatus(
            phase=ReplicaPhase.KILLED,
            signal=job.signal or int(signal.SIGTERM),
            ended_at=ended,
            detail=where,
            **common,
        )
    why = _ENDED_AS_LOST.get(state, "it was cancelled outside Allotment")
    return ReplicaStatus(
        phase=ReplicaPhase.LOST, ended_at=ended, detail=f"{where}: {why}", **common
    )
