"""The per-replica supervisor: ``python -m allotment.executors.supervisor REPLICA_DIR``.

It reads ``spec.json`` from the replica directory, starts the command in a process group
of its own and records what happens in ``state.json`` (replaced atomically, so a reader
never sees half a file):

- first of all: ``supervisor_pid`` (so a repeated launch knows a supervisor ran);
- at start: ``pid``, ``pgid``, ``leader_started`` (the group leader's start, in ticks
  since boot: with the pgid, what identifies the group), ``started_at``,
  ``memory_enforcement`` (and ``container_pid`` with ``container_started``, a
  container's first process, once it runs);
- at the end: ``ended_at`` and either ``exit_code`` or ``signal``, plus ``oom``,
  ``oom_evidence``, ``timed_out``, ``stop_requested`` and ``max_rss_bytes``.

SIGTERM to the supervisor (sent by ``LocalExecutor.stop``) is forwarded to the child's
group; the group is SIGKILLed once the grace from ``stop.json`` has passed. Passing
``max_runtime`` does the same with ``timeout_grace_s``. When the child leader ends, the
rest of its group is SIGKILLed so nothing outlives the replica.

Containers: when the spec has a ``container`` section, the command is ``podman run``
(built by :mod:`allotment.executors.containers`). Before it starts, the image is looked
for (and pulled when the runtime allows); a missing image ends the replica with
``image_error`` (failure class ``image``), as does Podman's own failure to create or
start the container (exit status 125, 126 or 127 from a container that never ran). A
stop is forwarded to the container by Podman; the SIGKILL after the grace goes to the
container too (``podman kill``), and the container is removed once it ended (after its
state and ``OOMKilled`` flag were read). A plain command that cannot be started (no such
program, not executable) ends with ``start_error`` and exit code 127 (failure class
``launch``), its reason in ``detail`` and in the stderr log.

Limits of plain processes: memory is enforced with ``RLIMIT_AS`` on replicas without
GPUs (CUDA reserves large virtual address ranges, so an address-space limit would break
GPU programs); cgroup v2 is only detected, not used yet (:func:`cgroup_v2_delegated`).
CPU limits are recorded but not enforced (a container runtime enforces both).

OOM detection is best effort: ``oom`` is set when the kernel's OOM-kill counter for our
cgroup rose while the child ran (cgroup v2 ``memory.events`` or v1
``memory.oom_control``), when the child died of a SIGKILL we did not send while its peak
RSS was at its memory limit, or when a child under ``RLIMIT_AS`` exited non-zero with an
allocation failure in the tail of its stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from allotment.executors.procfs import started

SPEC_FILE = "spec.json"
STATE_FILE = "state.json"
STOP_FILE = "stop.json"
POLL_S = 0.05
_ALLOC_FAILURES = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc")
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` (mode 0600: a spec holds the job's environment)
    through a temporary file and ``os.replace``, synced first."""
    write_text_private(path, json.dumps(data, sort_keys=True), sync=True)


def write_text_private(path: Path, text: str, *, sync: bool = False) -> None:
    """Write ``text`` to ``path`` (mode 0600) through a temporary file and ``os.replace``
    (``sync``: on disk before it replaces the old file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    tmp.replace(path)


def send_wake(sock: socket.socket, port: int, secret: str) -> None:
    """A ``wake`` datagram to ``port`` of 127.0.0.1: one line, the listener's secret
    first (the format of :mod:`allotment.control.wake`, which this package may not
    import). Lost when nobody listens: the loop's tick finds what it was about."""
    with contextlib.suppress(OSError):
        sock.sendto(f"{secret} wake".encode(), ("127.0.0.1", port))


def tell_ended(wake_file: object) -> None:
    """Tell the leading scheduler that a replica ended: ``wake`` to the port that
    ``wake_file`` names with its secret. Silent when there is none."""
    if not isinstance(wake_file, str):
        return
    try:
        words = Path(wake_file).read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        return
    if len(words) == 2 and words[0].isdigit():
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            send_wake(sock, int(words[0]), words[1])


def read_json(path: Path) -> dict[str, Any] | None:
    """The object in ``path``, or ``None`` when it is absent or unreadable."""
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cgroup_v2_delegated() -> bool:
    """Whether this process could create cgroup v2 children with memory and cpu control."""
    try:
        line = Path("/proc/self/cgroup").read_text(encoding="utf-8").strip().splitlines()
    except OSError:
        return False
    if line != [line[0]] or not line[0].startswith("0::"):
        return False
    own = _CGROUP_ROOT / line[0][3:].lstrip("/")
    try:
        controllers = (own / "cgroup.subtree_control").read_text(encoding="utf-8").split()
    except OSError:
        return False
    return {"memory", "cpu"} <= set(controllers) and os.access(own, os.W_OK)


def oom_kill_count() -> int | None:
    """The kernel's OOM-kill counter for this process's memory cgroup, when readable."""
    candidates = [_CGROUP_ROOT / "memory.events", _CGROUP_ROOT / "memory" / "memory.oom_control"]
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def _log_tail(path: Path, size: int = 4096) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read()
    except OSError:
        return b""


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


PODMAN_FAILED = (125, 126, 127)
"""``podman run``'s exit statuses when it could not create or start the container."""
PODMAN_TIMEOUT_S = 120.0
CONTAINER_LOOK_S = 0.5
"""How often the supervisor looks for the container's process until it has found it."""


class _Container:
    """The Podman side of one container replica (``spec["container"]``)."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str]) -> None:
        self.base = [str(part) for part in spec["base"]]
        self.name = str(spec["name"])
        self.image = str(spec["image"])
        self.pull = str(spec.get("pull", "never"))
        self.env = env

    def podman(self, *args: str, timeout: float = PODMAN_TIMEOUT_S) -> tuple[int, str]:
        try:
            result = subprocess.run(
                [*self.base, *args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 1, str(exc)
        return result.returncode, (result.stdout + result.stderr).strip()

    def prepare(self) -> str | None:
        """Make sure the image is here (pulling it when allowed) and no container of
        the same name is left; what went wrong, or ``None``."""
        self.podman("rm", "--force", "--ignore", self.name)
        code, _ = self.podman("image", "exists", self.image)
        if code == 0:
            return None
        if self.pull != "missing":
            return f"image {self.image} is not on this node (and the runtime pulls never)"
        code, out = self.podman("pull", "--quiet", self.image, timeout=1800.0)
        if code == 0:
            return None
        tail = out.splitlines()[-1] if out else ""
        return f"image {self.image} could not be pulled: {tail}"

    def kill(self) -> None:
        self.podman("kill", "--signal", "KILL", self.name, timeout=30.0)

    def pid(self) -> int | None:
        """The container's first process on this host, once it runs."""
        code, out = self.podman("inspect", "--format", "{{.State.Pid}}", self.name, timeout=10.0)
        value = out.strip()
        return int(value) if code == 0 and value.isdigit() and int(value) > 0 else None

    def finish(self) -> tuple[bool, bool]:
        """Remove the ended container; whether it ran (its program started and exited,
        so an exit status is the program's own) and whether the kernel's OOM killer
        ended it."""
        code, out = self.podman(
            "inspect", "--format", "{{.State.Status}} {{.State.OOMKilled}}", self.name
        )
        self.podman("rm", "--force", "--ignore", self.name)
        words = out.split() if code == 0 else []
        ran = bool(words) and words[0] == "exited"
        return ran, len(words) > 1 and words[1].lower() == "true"


class _Supervisor:
    def __init__(self, replica_dir: Path) -> None:
        self.dir = replica_dir
        self.term_requested = False
        self.state: dict[str, Any] = {"supervisor_pid": os.getpid()}

    def on_term(self, _signum: int, _frame: FrameType | None) -> None:
        self.term_requested = True

    def save(self, **fields: Any) -> None:
        self.state.update(fields)
        write_json_atomic(self.dir / STATE_FILE, self.state)

    def grace(self) -> float:
        stop = read_json(self.dir / STOP_FILE) or {}
        value = stop.get("grace_s", 10.0)
        return float(value) if isinstance(value, int | float) else 10.0

    def run(self) -> int:
        # Said first: a launch repeated after a crash must find that this replica's
        # supervisor ran, even if it died before starting anything.
        self.save()
        spec = read_json(self.dir / SPEC_FILE)
        if spec is None:
            self.save(ended_at=time.time(), exit_code=None, detail="spec.json unreadable")
            return 2
        if self.term_requested:
            self.save(ended_at=time.time(), stop_requested=True, detail="stopped before start")
            return 0
        raw_memory = spec.get("memory_bytes")
        memory = raw_memory if isinstance(raw_memory, int) else None
        use_rlimit = memory is not None and not spec.get("devices")
        enforcement = "rlimit_as" if use_rlimit else "none"

        def limit() -> None:
            if use_rlimit and memory is not None:
                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

        stdout_path = Path(spec["stdout_path"])
        stderr_path = Path(spec["stderr_path"])
        container = (
            _Container(spec["container"], spec["env"])
            if isinstance(spec.get("container"), dict)
            else None
        )
        if container is not None:
            use_rlimit = False
            enforcement = "container"
            problem = container.prepare()
            if problem is not None:
                with contextlib.suppress(OSError), stderr_path.open("a") as note:
                    note.write(f"allotment: {problem}\n")
                now = time.time()
                self.save(
                    started_at=now, ended_at=now, exit_code=None, image_error=True, detail=problem
                )
                return 0
            if self.term_requested:
                self.save(ended_at=time.time(), stop_requested=True, detail="stopped before start")
                return 0
        oom_before = oom_kill_count()
        try:
            with stdout_path.open("ab") as out, stderr_path.open("ab") as err:
                child = subprocess.Popen(
                    spec["command"],
                    cwd=spec["workdir"],
                    env=spec["env"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=limit,
                )
        except OSError as exc:
            detail = f"could not start the command: {exc}"
            with contextlib.suppress(OSError), stderr_path.open("a") as note:
                note.write(f"allotment: {detail}\n")  # so that allot logs says why
            now = time.time()
            self.save(started_at=now, ended_at=now, exit_code=127, start_error=True, detail=detail)
            return 0
        self.save(
            pid=child.pid,
            pgid=child.pid,
            leader_started=started(child.pid),
            started_at=time.time(),
            memory_enforcement=enforcement,
        )
        deadline = None
        if isinstance(spec.get("max_runtime"), int | float):
            deadline = time.monotonic() + float(spec["max_runtime"])
        kill_at: float | None = None
        stop_requested = timed_out = kill_sent = False
        next_look = time.monotonic() + CONTAINER_LOOK_S
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            now = time.monotonic()
            if container is not None and "container_pid" not in self.state and now >= next_look:
                next_look = now + CONTAINER_LOOK_S
                found = container.pid()
                if found:
                    # The container's processes descend from Podman's monitor, not from
                    # the client we started: usage readers need its first process.
                    self.save(container_pid=found, container_started=started(found))
            if kill_at is None and self.term_requested:
                stop_requested = True
                _killpg(child.pid, signal.SIGTERM)
                kill_at = now + self.grace()
            elif kill_at is None and deadline is not None and now >= deadline:
                timed_out = True
                _killpg(child.pid, signal.SIGTERM)
                kill_at = now + float(spec.get("timeout_grace_s", 10.0))
            if kill_at is not None and not kill_sent and now >= kill_at:
                kill_sent = True
                if container is not None:
                    container.kill()
                _killpg(child.pid, signal.SIGKILL)
            time.sleep(POLL_S)
        child.returncode = os.waitstatus_to_exitcode(status)
        _killpg(child.pid, signal.SIGKILL)
        code = child.returncode
        max_rss = usage.ru_maxrss * 1024
        evidence = ""
        image_error = False
        detail = ""
        if container is not None:
            ran, oom_killed = container.finish()
            if oom_killed:
                evidence = "container_oom_killed"
            elif code == 128 + signal.SIGKILL and not kill_sent and memory is not None:
                # cgroup v1 hosts do not always report OOMKilled; nothing but the OOM
                # killer SIGKILLs a container we did not stop.
                evidence = "container_sigkill_under_memory_limit"
            if code in PODMAN_FAILED and not ran and not stop_requested:
                image_error = True
                detail = "the container could not be created or started (see the replica's stderr)"
        else:
            oom_after = oom_kill_count()
            if oom_before is not None and oom_after is not None and oom_after > oom_before:
                evidence = "kernel_oom_kill"
            elif code == -signal.SIGKILL and not kill_sent and memory is not None:
                evidence = "sigkill_at_limit" if max_rss >= memory * 0.9 else ""
            elif (
                code > 0
                and use_rlimit
                and any(m in _log_tail(stderr_path) for m in _ALLOC_FAILURES)
            ):
                evidence = "rlimit_as_alloc_failure"
        self.save(
            ended_at=time.time(),
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            oom=bool(evidence),
            oom_evidence=evidence,
            timed_out=timed_out,
            stop_requested=stop_requested,
            max_rss_bytes=max_rss,
            image_error=image_error,
            **({"detail": detail} if detail else {}),
        )
        tell_ended(spec.get("wake_file"))
        return 0


def main(argv: list[str]) -> int:
    """Supervise the replica in ``argv[0]``; returns the supervisor's own exit status."""
    supervisor = _Supervisor(Path(argv[0]))
    signal.signal(signal.SIGTERM, supervisor.on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
