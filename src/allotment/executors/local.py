"""The local executor: each replica is a process on this machine under a supervisor.

Layout under the state root, one directory per replica::

    STATE_ROOT/<job_id>/<attempt>/<replica>-<index>/
        supervisor.lock  held by the launch, then by the supervisor while it lives
        spec.json     what to run (written once, before the supervisor starts)
        container.env a container's environment (mode 0600; containers only)
        launch.json   the supervisor's pid, written by the executor
        state.json    written by the supervisor (see :mod:`.supervisor`)
        stop.json     a stop request (grace), written by :meth:`LocalExecutor.stop`
        stdout.log, stderr.log, supervisor.log

Everything the executor knows is in these files, so a new instance on the same root (a
restarted server) re-adopts running replicas and learns how finished ones ended.

With ``runtime.kind: podman`` each replica's command is ``podman run`` of its image
(:mod:`.containers`); the replica's working directory is handed to its tenant's uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import allotment
from allotment.domain.cluster import Node
from allotment.domain.executor import RuntimeSpec
from allotment.executors.base import (
    Executor,
    GpuInfo,
    LaunchRequest,
    ReplicaKey,
    ReplicaPhase,
    ReplicaStatus,
    ReplicaUsage,
)
from allotment.executors.containers import (
    PROCESS_ENFORCEMENT,
    Probe,
    gpu_device_args,
    hand_over,
    podman_base,
    podman_run,
    probe,
    require_containers,
)
from allotment.executors.gpus import discover_gpus
from allotment.executors.procfs import (
    ProcessInfo,
    environment,
    members,
    process_table,
    survivors,
)
from allotment.executors.supervisor import (
    SPEC_FILE,
    STATE_FILE,
    STOP_FILE,
    read_json,
    write_json_atomic,
    write_text_private,
)

LAUNCH_FILE = "launch.json"
WAKE_FILE = "wake"
"""In the state root: ``PORT SECRET`` of the leading scheduler's listener, which every
supervisor tells when its replica ends (:meth:`LocalExecutor.wake_on_end`)."""
LOCK_FILE = "supervisor.lock"
ENV_FILE = "container.env"
LOOPBACK = "127.0.0.1"
LAUNCH_WINDOW_S = 30.0
REPLICA_KEY_ENV = "ALLOTMENT_REPLICA_KEY"
"""Set in every replica's environment to its key (``job/attempt/group-index``)."""
"""How long a replica without a recorded supervisor counts as starting, not lost."""
BASE_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "TZ")
"""Server environment variables a replica inherits when no ``base_env`` is given."""


def _segment(text: str) -> str:
    """``text`` as one safe path segment (``/`` and leading dots escaped)."""
    return quote(text, safe="").replace(".", "%2E")


def _common(state: Mapping[str, Any]) -> dict[str, Any]:
    """What every status of a replica reports from its state file."""
    return {
        "pid": state.get("pid"),
        "started_at": state.get("started_at"),
        "stop_requested": bool(state.get("stop_requested", False)),
        "detail": str(state.get("detail", "")),
    }


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _process_state(pid: int) -> str | None:
    """The ``/proc`` state letter of ``pid`` (``Z`` for a zombie), ``None`` when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return _signal_zero(pid)
    return stat.rpartition(")")[2].split()[0]


def _signal_zero(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "?"
    return "?"


def _left(state: Mapping[str, Any], table: Mapping[int, ProcessInfo]) -> set[int]:
    """The processes of a replica still running, by what its supervisor recorded: its
    process group (identified by the leader's start time) and its container's first
    process (by its own)."""
    left: set[int] = set()
    pgid = state.get("pgid")
    if isinstance(pgid, int):
        leader = state.get("leader_started")
        left |= survivors(table, pgid, leader if isinstance(leader, int) else None)
    first = state.get("container_pid")
    if isinstance(first, int):
        info = table.get(first)
        if info is not None and info.started == state.get("container_started"):
            left.add(first)
    return left


def _named(key: ReplicaKey, table: Mapping[int, ProcessInfo]) -> set[int]:
    """The processes whose environment names ``key``'s replica."""
    want = str(key)
    return {
        pid
        for pid in table
        if pid != os.getpid() and (environment(pid) or {}).get(REPLICA_KEY_ENV) == want
    }


def _block_term() -> None:
    # The supervisor unblocks SIGTERM once its handler is installed, so a stop sent
    # while it starts is not lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


class LocalExecutor(Executor):
    """Runs replicas as local processes, each under ``python -m
    allotment.executors.supervisor`` in a session of its own (so it outlives the server).

    ``node`` declares this machine's GPUs for :meth:`inventory` when NVML is absent.
    ``base_env`` is the environment every replica starts from (default: a few
    variables of the server's own, :data:`BASE_ENV_NAMES`); the job's ``env`` and
    ``CUDA_VISIBLE_DEVICES`` go on top. ``runtime`` says whether replicas run as plain
    processes (the default) or containers.
    """

    def __init__(
        self,
        state_root: Path,
        *,
        node: Node | None = None,
        base_env: Mapping[str, str] | None = None,
        runtime: RuntimeSpec | None = None,
    ) -> None:
        self.runtime = runtime or RuntimeSpec()
        self.state_root = Path(state_root)
        self.state_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.state_root.chmod(0o700)  # the replicas' specs hold their environment
        self.node = node
        if base_env is None:
            base_env = {k: os.environ[k] for k in BASE_ENV_NAMES if k in os.environ}
        self.base_env = dict(base_env)
        self._children: dict[ReplicaKey, subprocess.Popen[bytes]] = {}
        self._none_named: set[ReplicaKey] = set()
        """Lost replicas, recorded without a process group, of which nothing runs."""
        self._cpu_seen: dict[ReplicaKey, tuple[float, float]] = {}
        """CPU seconds of each replica's processes at the last :meth:`usage`, and when."""

    def wake_on_end(self, port: int, secret: str) -> None:
        """Every supervisor, its replica ended, sends ``wake`` to ``port`` (read from
        :data:`WAKE_FILE` then, so replicas started by an earlier leader tell this one)."""
        write_text_private(self.state_root / WAKE_FILE, f"{port} {secret}\n")

    def replica_dir(self, key: ReplicaKey) -> Path:
        """The directory holding ``key``'s files."""
        return (
            self.state_root
            / _segment(key.job_id)
            / str(key.attempt)
            / f"{_segment(key.replica)}-{key.index}"
        )

    def launch(self, request: LaunchRequest) -> str:
        """Start the replica's supervisor unless ``request.key`` was launched before
        (by this instance or any other on the same root); return ``str(key)``.
        Raises ``OSError`` when the supervisor cannot be started.

        Idempotent against every partial state a crash can leave: the replica's lock
        (``supervisor.lock``) is taken before anything starts and handed to the
        supervisor, which holds it while it lives, and the supervisor's first act is to
        write ``state.json``. So a launch finding the lock held leaves a live launch or
        supervisor alone; one finding ``state.json`` leaves a replica that already ran
        to :meth:`observe`; anything else (a directory, a temporary or whole spec, no
        supervisor) never started, and is launched now."""
        key = request.key
        directory = self.replica_dir(key)
        directory.mkdir(parents=True, exist_ok=True)
        lock = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return str(key)
            if (directory / STATE_FILE).exists():
                return str(key)
            self._start(request, directory, lock)
        finally:
            os.close(lock)
        return str(key)

    def _start(self, request: LaunchRequest, directory: Path, lock: int) -> None:
        """Write the replica's spec and start its supervisor, which inherits ``lock``."""
        key = request.key
        env = {**self.base_env, **request.env}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in request.devices)
        command = list(request.command)
        container: dict[str, Any] | None = None
        if request.container is not None:
            command, env, container = self._container(request, directory)
        # Finds the replica's processes should its supervisor die before recording them.
        env[REPLICA_KEY_ENV] = str(key)
        spec: dict[str, Any] = {
            "job_id": key.job_id,
            "attempt": key.attempt,
            "replica": key.replica,
            "index": key.index,
            "command": command,
            "env": env,
            "workdir": str(request.workdir),
            "stdout_path": str(request.stdout_path or directory / "stdout.log"),
            "stderr_path": str(request.stderr_path or directory / "stderr.log"),
            "devices": list(request.devices),
            "cpu_millis": request.cpu_millis,
            "memory_bytes": request.memory_bytes,
            "max_runtime": request.max_runtime,
            "timeout_grace_s": request.timeout_grace_s,
            "wake_file": str(self.state_root / WAKE_FILE),
        }
        if container is not None:
            spec["container"] = container
        write_json_atomic(directory / SPEC_FILE, spec)
        package_root = str(Path(allotment.__file__).resolve().parent.parent)
        supervisor_env = dict(os.environ)
        supervisor_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p
        )
        with (directory / "supervisor.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "allotment.executors.supervisor", str(directory)],
                env=supervisor_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_block_term,
                pass_fds=(lock,),
            )
        self._children[key] = process
        write_json_atomic(
            directory / LAUNCH_FILE, {"supervisor_pid": process.pid, "launched_at": time.time()}
        )

    def _container(
        self, request: LaunchRequest, directory: Path
    ) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        """The ``podman run`` command of a container replica, the environment Podman
        itself runs with, and the supervisor's ``container`` section. The container's
        environment goes to a file only the server's user can read; the working
        directory is handed to the tenant's uid (when the server is root). Podman
        itself runs with the server's base environment only; a value the file cannot
        carry (a line break) is refused (``OSError``)."""
        container = request.container
        assert container is not None
        require_containers(self.runtime)
        env_path = directory / ENV_FILE
        try:
            run = podman_run(
                self.runtime,
                request,
                env_file=str(env_path),
                device_args=gpu_device_args(self.runtime, request.devices),
            )
        except ValueError as exc:  # a line break in a value; a device node missing
            raise OSError(str(exc)) from exc
        hand_over(request, run, env_path)
        section = {
            "base": podman_base(self.runtime),
            "name": run.name,
            "image": container.image,
            "pull": self.runtime.pull,
        }
        return run.argv, dict(self.base_env), section

    def stop(self, key: ReplicaKey, grace_s: float) -> None:
        """Ask ``key``'s supervisor to stop it (SIGTERM to the group, SIGKILL after
        ``grace_s``). Without a live supervisor, the replica's group is SIGKILLed at
        once. Does not block."""
        directory = self.replica_dir(key)
        if not (directory / SPEC_FILE).exists():
            return
        state = read_json(directory / STATE_FILE) or {}
        if "ended_at" in state:
            return
        write_json_atomic(directory / STOP_FILE, {"grace_s": grace_s, "requested_at": time.time()})
        supervisor = self._supervisor_pid(directory, state)
        if supervisor is not None and self._alive(key, supervisor):
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGTERM)
            return
        pgid = state.get("pgid")
        leader = state.get("leader_started")
        if isinstance(pgid, int) and survivors(
            process_table(), pgid, leader if isinstance(leader, int) else None
        ):
            # Only a group proven to be the replica's (its leader's start time): its
            # number may have been given to another group since it ended.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        elif pgid is None:
            # The supervisor died before recording its child: what names the replica.
            for pid in self._lingering(key, state, process_table):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        spec = read_json(directory / SPEC_FILE) or {}
        container = spec.get("container")
        if isinstance(container, dict):
            # Without its supervisor nobody else would end the container: Podman keeps
            # it running after its client is killed.
            self._podman("rm", "--force", "--time", "0", "--ignore", str(container["name"]))

    def _podman(self, *args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(
                [*podman_base(self.runtime), *args],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None

    def observe(self) -> dict[ReplicaKey, ReplicaStatus]:
        """Read every replica's files under the state root. Does not block."""
        seen: dict[ReplicaKey, ReplicaStatus] = {}
        table: dict[int, ProcessInfo] | None = None

        def processes() -> dict[int, ProcessInfo]:
            nonlocal table
            if table is None:
                table = process_table()
            return table

        for spec_path in sorted(self.state_root.glob(f"*/*/*/{SPEC_FILE}")):
            spec = read_json(spec_path)
            if spec is None:
                continue
            key = ReplicaKey(
                str(spec["job_id"]), int(spec["attempt"]), str(spec["replica"]), int(spec["index"])
            )
            seen[key] = self._status(key, spec_path.parent, processes)
        return seen

    def usage(self) -> dict[ReplicaKey, ReplicaUsage]:
        """CPU cores and resident memory of every running replica: its process group
        and the descendants of its process, read from ``/proc``. CPU is averaged since
        the previous call (``None`` on a replica's first). Does not block."""
        table = process_table()
        now = time.monotonic()
        seen: dict[ReplicaKey, ReplicaUsage] = {}
        cpu_seen: dict[ReplicaKey, tuple[float, float]] = {}
        for key, status in self.observe().items():
            if status.phase is not ReplicaPhase.RUNNING or status.pid is None:
                continue
            state = read_json(self.replica_dir(key) / STATE_FILE) or {}
            pgid = state.get("pgid")
            roots = [status.pid]
            if isinstance(state.get("container_pid"), int):
                roots.append(state["container_pid"])
            pids = members(table, roots, pgid if isinstance(pgid, int) else None)
            if not pids:
                continue
            cpu_s = sum(table[p].cpu_s for p in pids)
            before = self._cpu_seen.get(key)
            cores = None
            if before is not None and now > before[1]:
                cores = max(0.0, (cpu_s - before[0]) / (now - before[1]))
            cpu_seen[key] = (cpu_s, now)
            seen[key] = ReplicaUsage(
                cpu_cores=cores,
                memory_bytes=sum(table[p].rss for p in pids),
                pids=tuple(sorted(pids)),
            )
        self._cpu_seen = cpu_seen
        return seen

    def address(self, node: str) -> str:
        """Every node of a local cluster is this machine."""
        return LOOPBACK

    def check(self) -> list[str]:
        """With containers: Podman and the OCI runtime must be installed and work."""
        if not self.runtime.containers:
            return []
        return self.probe().problems

    def probe(self) -> Probe:
        """What this host enforces (checked once)."""
        return probe(self.runtime)

    def enforcement(self) -> dict[str, str]:
        if not self.runtime.containers:
            return dict(PROCESS_ENFORCEMENT)
        return dict(self.probe().enforced)

    def images(self) -> dict[str, list[str]] | None:
        """The images Podman holds on this machine (every node of a local cluster is
        this machine); ``None`` with plain processes or when Podman cannot tell."""
        if not self.runtime.containers:
            return None
        result = self._podman("images", "--format", "json")
        if result is None or result.returncode != 0:
            return None
        try:
            listed = json.loads(result.stdout or "[]")
        except ValueError:
            return None
        names = sorted(
            {
                str(name)
                for image in listed
                if isinstance(image, dict)
                for name in image.get("Names") or []
            }
        )
        return {self.node.name if self.node is not None else "local": names}

    def inventory(self) -> list[GpuInfo]:
        """This machine's GPUs: NVML when available, else the ``node``'s declared ones."""
        return discover_gpus(self.node)

    def _supervisor_pid(self, directory: Path, state: Mapping[str, Any]) -> int | None:
        pid = state.get("supervisor_pid")
        if not isinstance(pid, int):
            pid = (read_json(directory / LAUNCH_FILE) or {}).get("supervisor_pid")
        return pid if isinstance(pid, int) else None

    def _lingering(
        self,
        key: ReplicaKey,
        state: Mapping[str, Any],
        processes: Callable[[], Mapping[int, ProcessInfo]],
    ) -> set[int]:
        """The processes of a replica whose supervisor is gone, still running. A
        supervisor killed between starting its child and recording it recorded nothing:
        then they are the processes whose environment names the replica. Once none
        does, none can again (nothing of the replica is left to start one), so the
        search of every process's environment is made until then only."""
        if "pgid" in state or "container_pid" in state:
            return _left(state, processes())
        if key in self._none_named:
            return set()
        left = _named(key, processes())
        if not left:
            self._none_named.add(key)
        return left

    def _alive(self, key: ReplicaKey, pid: int) -> bool:
        child = self._children.get(key)
        if child is not None and child.pid == pid and child.poll() is not None:
            return False
        state = _process_state(pid)
        return state is not None and state not in ("Z", "X")

    def _status(
        self, key: ReplicaKey, directory: Path, processes: Callable[[], dict[int, ProcessInfo]]
    ) -> ReplicaStatus:
        state = read_json(directory / STATE_FILE) or {}
        if "ended_at" not in state:
            supervisor = self._supervisor_pid(directory, state)
            if supervisor is not None and self._alive(key, supervisor):
                phase = ReplicaPhase.RUNNING if "pid" in state else ReplicaPhase.STARTING
                return ReplicaStatus(phase=phase, **_common(state))
            if supervisor is None and _age(directory / SPEC_FILE) < LAUNCH_WINDOW_S:
                # Launched a moment ago by another instance: launch.json is not written yet.
                return ReplicaStatus(phase=ReplicaPhase.STARTING, **_common(state))
            # The supervisor may have recorded the end and exited since the first read:
            # only a supervisor gone with no end recorded, read after it was gone, is lost.
            state = read_json(directory / STATE_FILE) or {}
        common = _common(state)
        if "ended_at" in state:
            sig = state.get("signal")
            return ReplicaStatus(
                phase=ReplicaPhase.KILLED if sig is not None else ReplicaPhase.EXITED,
                ended_at=state["ended_at"],
                exit_code=state.get("exit_code"),
                signal=sig,
                oom=bool(state.get("oom", False)),
                timed_out=bool(state.get("timed_out", False)),
                image_error=bool(state.get("image_error", False)),
                start_error=bool(state.get("start_error", False)),
                **common,
            )
        left = self._lingering(key, state, processes)
        common["detail"] = (
            f"supervisor gone without recording an end; {len(left)} of its processes still run"
            if left
            else "supervisor gone without recording an end"
        )
        return ReplicaStatus(phase=ReplicaPhase.LOST, lingering=bool(left), **common)
