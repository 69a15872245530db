"""Replicas as Podman containers: the ``podman run`` command line and what the host
enforces.

Both executors run a container replica the same way (the local executor under its
supervisor, Slurm's per-node launcher on its node)::

    podman --runtime runc run --name allot-… --init --pull never
        --user UID:GID --cap-drop all --security-opt no-new-privileges
        --network none|host --memory M --memory-swap M --cpus C --shm-size S
        --ulimit nofile=N:N --ulimit nproc=N:N
        --mount type=bind,source=WORKDIR,destination=/allotment/work -w /allotment/work
        --mount type=bind,source=SRC,destination=DST[,readonly] …
        --device /dev/nvidiaN …  --env-file FILE  --label allotment.…
        IMAGE COMMAND…

Nothing else of the host is visible: the root file system is the image's, ``/proc``
is the container's own, and the only host paths inside are the attempt's working
directory and the job's checked mounts. The job's environment goes through an
environment file (mode 0600), never the command line that other users could read.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import resource
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from allotment.domain.executor import RuntimeSpec
from allotment.domain.job import RESERVED_TARGET
from allotment.executors.base import LaunchRequest, ReplicaKey

WORKDIR = f"{RESERVED_TARGET}/work"
"""Where the attempt's working directory is mounted inside the container."""
LABEL = "allotment.replica"
"""The label every container of Allotment carries (its replica key)."""
GPU_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""Device nodes a CUDA program needs besides its GPUs, passed in when present."""
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
NOFILE_CAP = 65_536
NPROC_CAP = 16_384
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")


def container_name(key: ReplicaKey) -> str:
    """A Podman name for ``key``'s container: readable, and unique per key (a digest of
    the key keeps two ids that differ only in unsafe characters apart)."""
    digest = hashlib.sha256(str(key).encode()).hexdigest()[:8]
    readable = _NAME_UNSAFE.sub("_", f"{key.job_id}-{key.attempt}-{key.replica}-{key.index}")
    return f"allot-{readable[:80]}-{digest}"


def host_ulimits() -> tuple[int, int]:
    """``nofile`` and ``nproc`` for containers: this host's hard limits, at most
    :data:`NOFILE_CAP` and :data:`NPROC_CAP`. Podman's own defaults exceed the hard
    limits on some hosts, and then no container starts; Podman's monitor also runs
    under a lower process limit than the host's (32768 seen), so ``nproc`` stays below."""

    def hard(which: int, cap: int) -> int:
        value = resource.getrlimit(which)[1]
        return cap if value == resource.RLIM_INFINITY else min(value, cap)

    return hard(resource.RLIMIT_NOFILE, NOFILE_CAP), hard(resource.RLIMIT_NPROC, NPROC_CAP)


def cdi_available() -> bool:
    """Whether a CDI specification for ``nvidia.com/gpu`` is installed on this host."""
    for directory in CDI_DIRS:
        try:
            names = [entry.name for entry in Path(directory).iterdir()]
        except OSError:
            continue
        for name in names:
            if name.startswith("nvidia") and name.endswith((".yaml", ".json")):
                return True
    return False


def gpu_device_args(
    runtime: RuntimeSpec, devices: Sequence[int], *, cdi: bool | None = None
) -> list[str]:
    """The ``--device`` options for the node-local GPU indexes ``devices``: CDI names,
    or the device nodes (``nvidiaN`` and the control nodes present) under
    ``runtime.device_dir``, each at its usual ``/dev`` path inside.

    On a host without any GPU device node the GPUs are virtual (declared in
    ``cluster.yaml``, none found by NVML): there is nothing to pass in. On a host with
    some, a missing one raises ``ValueError``: running the replica without its GPU
    would hide a misconfigured ``device_dir``."""
    if not devices:
        return []
    use_cdi = runtime.gpu_devices == "cdi" or (
        runtime.gpu_devices == "auto" and (cdi_available() if cdi is None else cdi)
    )
    if use_cdi:
        return [arg for d in devices for arg in ("--device", f"nvidia.com/gpu={d}")]
    root = Path(runtime.device_dir)
    if not gpu_device_nodes(root):
        return []
    nodes = [f"nvidia{d}" for d in devices]
    absent = [n for n in nodes if not (root / n).exists()]
    if absent:
        raise ValueError(
            f"no device node {root / absent[0]} for the replica's GPU; check "
            "executor.runtime.device_dir"
        )
    nodes += [n for n in GPU_CONTROL_NODES if (root / n).exists()]
    return [arg for n in nodes for arg in ("--device", f"{root / n}:/dev/{n}")]


def gpu_device_nodes(root: Path) -> list[str]:
    """The GPU device nodes (``nvidia0``, ``nvidia1``, …) under ``root``."""
    try:
        return sorted(
            entry.name for entry in root.iterdir() if re.fullmatch(r"nvidia[0-9]+", entry.name)
        )
    except OSError:
        return []


def container_env(request: LaunchRequest) -> dict[str, str]:
    """The environment inside the container: the request's (the job's own, Allotment's
    and the rendezvous variables), ``HOME`` in the working directory, and
    ``CUDA_VISIBLE_DEVICES`` renumbered from 0 (the container sees only its GPUs), with
    the host's indexes in ``ALLOTMENT_HOST_DEVICES``."""
    env = {"HOME": WORKDIR, **request.env}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(request.devices)))
    env["ALLOTMENT_HOST_DEVICES"] = ",".join(str(d) for d in request.devices)
    return env


def env_file_text(env: Mapping[str, str]) -> str:
    """``env`` as a Podman environment file. Raises ``ValueError`` for a value with a
    line break, which such a file cannot carry (and which must never reach Podman's own
    environment instead: Podman runs as the server's user, and a job's ``LD_PRELOAD``
    or ``CONTAINERS_CONF`` there would change how Podman itself runs)."""
    broken = sorted(name for name, value in env.items() if "\n" in value or "\r" in value)
    if broken:
        raise ValueError(
            f"environment values with line breaks cannot go to a container: {', '.join(broken)}"
        )
    return "".join(f"{name}={value}\n" for name, value in sorted(env.items()))


def bind_arg(source: str, target: str, read_only: bool) -> str:
    """One ``--mount`` value; raises ``ValueError`` for a path Podman's option syntax
    cannot carry (a comma, a double quote, a newline: Podman reads the value as CSV)."""
    for path in (source, target):
        if any(c in path for c in ',"\n\r\x00'):
            raise ValueError(
                f"path {path!r} cannot be mounted (it holds a comma, double quote or newline)"
            )
    arg = f"type=bind,source={source},destination={target}"
    return arg + (",readonly" if read_only else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class PodmanRun:
    """The pieces of one replica's ``podman run``."""

    argv: list[str]
    env_file: str
    name: str = ""


def require_containers(runtime: RuntimeSpec) -> None:
    """Raise ``OSError`` when ``runtime`` runs plain processes (a container request
    reaching it would otherwise run without its isolation)."""
    if not runtime.containers:
        raise OSError(
            "this executor runs plain processes (executor.runtime.kind: process); "
            "it cannot run a container"
        )


def hand_over(request: LaunchRequest, run: PodmanRun, env_path: Path) -> None:
    """Before a container replica starts: write its environment file (mode 0600, the
    server's user only) and hand its working directory to its tenant's uid and gid
    (mode 0700; when this server is root, which alone may)."""
    container = request.container
    assert container is not None
    fd = os.open(env_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)  # also when the file was there before
        fh.write(run.env_file)
    if os.geteuid() == 0:
        os.chown(request.workdir, container.uid, container.gid)
        Path(request.workdir).chmod(0o700)


def podman_base(runtime: RuntimeSpec) -> list[str]:
    """``podman --runtime RUNTIME``: the start of every Podman command."""
    return [runtime.podman, "--runtime", runtime.oci_runtime]


def podman_run(
    runtime: RuntimeSpec,
    request: LaunchRequest,
    *,
    env_file: str,
    device_args: Sequence[str] = (),
    ulimits: tuple[int | str, int | str] | None = None,
    workdir: str | None = None,
    host_env: Sequence[str] = (),
    sig_proxy: bool = True,
    passthrough_logs: bool = False,
) -> PodmanRun:
    """``podman run`` for ``request`` (which must carry a container). ``env_file`` is
    where the caller writes :attr:`PodmanRun` environment; ``device_args`` are the GPU
    options (:func:`gpu_device_args`); ``ulimits`` are ``nofile`` and ``nproc`` (default
    :func:`host_ulimits`; a launcher that learns them on its node passes placeholders);
    ``workdir`` is the host directory mounted as the working directory (default
    ``request.workdir``). ``host_env`` names variables whose values are only known where
    Podman runs: they are left out of the file and passed as ``--env NAME``, taken from
    Podman's own environment. ``sig_proxy=False`` stops Podman from forwarding the
    signals it gets to the container, for a caller that forwards them itself (Podman
    then ends on SIGTERM and SIGINT and leaves the container running: that caller
    waits for the container with ``podman wait``). ``passthrough_logs`` hands Podman's
    standard output and error to the container itself (``--log-driver passthrough``),
    so that what it writes still reaches them after Podman has gone."""
    container = request.container
    if container is None:
        raise ValueError("the request has no container")
    nofile, nproc = ulimits or host_ulimits()
    name = container_name(request.key)
    argv = [
        *podman_base(runtime),
        "run",
        "--name",
        name,
        "--init",
        *([] if sig_proxy else ["--sig-proxy=false"]),
        *(["--log-driver", "passthrough"] if passthrough_logs else []),
        "--pull",
        "never",
        "--user",
        f"{container.uid}:{container.gid}",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--network",
        "host" if container.network else "none",
        "--shm-size",
        f"{container.shm_bytes}b",
        "--ulimit",
        f"nofile={nofile}:{nofile}",
        "--ulimit",
        f"nproc={nproc}:{nproc}",
        "--label",
        f"{LABEL}={request.key}",
        "--label",
        f"allotment.tenant={container.tenant}",
        "--mount",
        bind_arg(workdir or str(request.workdir), WORKDIR, False),
        "--workdir",
        WORKDIR,
    ]
    if request.memory_bytes:
        memory = f"{request.memory_bytes}b"
        argv += ["--memory", memory, "--memory-swap", memory]
    if request.cpu_millis:
        argv += ["--cpus", f"{request.cpu_millis / 1000:g}"]
    for bind in container.binds:
        argv += ["--mount", bind_arg(bind.source, bind.target, bind.read_only)]
    argv += list(device_args)
    env = container_env(request)
    text = env_file_text({k: v for k, v in env.items() if k not in host_env})
    argv += ["--env-file", env_file]
    for item in host_env:
        argv += ["--env", item]
    argv += [container.image, *request.command]
    return PodmanRun(argv=argv, env_file=text, name=name)


@dataclass(frozen=True, slots=True)
class Probe:
    """What a host can enforce for containers: ``problems`` keep containers from
    running at all; ``enforced`` says, by aspect, what is enforced and by what."""

    problems: list[str]
    enforced: dict[str, str]


def _cgroup_controllers() -> tuple[str, set[str]]:
    """This host's cgroup version (``v1``, ``v2``, ``hybrid``) and the controllers
    available to containers."""
    root = Path("/sys/fs/cgroup")
    try:
        unified = (root / "cgroup.controllers").read_text(encoding="utf-8").split()
        return "v2", set(unified)
    except OSError:
        pass
    found = set()
    for name in ("memory", "cpu", "pids"):
        if (root / name).is_dir():
            found.add(name)
    hybrid = (root / "unified").is_dir()
    return ("hybrid" if hybrid else "v1"), found


@functools.lru_cache(maxsize=16)
def probe(runtime: RuntimeSpec, *, run: bool = True) -> Probe:
    """Check that Podman and the OCI runtime are there and work (``podman info``, when
    ``run``), and say what this host enforces. Checked once per runtime setting in a
    process (every executor of it shares the answer)."""
    problems: list[str] = []
    podman = shutil.which(runtime.podman)
    if podman is None:
        problems.append(
            f"executor.runtime.kind is podman but {runtime.podman!r} is not installed "
            "(install Debian's podman and runc packages, or set executor.runtime.kind: process)"
        )
    elif shutil.which(runtime.oci_runtime) is None and not Path(runtime.oci_runtime).exists():
        problems.append(
            f"the OCI runtime {runtime.oci_runtime!r} is not installed (install runc, or set "
            "executor.runtime.oci_runtime)"
        )
    elif run:
        try:
            result = subprocess.run(
                [*podman_base(runtime), "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"podman info failed: {exc}")
        else:
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
                problems.append(f"podman info failed: {tail[0]}")
    version, controllers = _cgroup_controllers()
    root = os.geteuid() == 0
    devices_at = Path(runtime.device_dir)
    enforced = {
        "image": "enforced: the job's image is its root file system (Podman)",
        "mounts": (
            "enforced: only the working directory and the job's mounts, re-checked against "
            "its tenant's data scopes at launch"
        ),
        "network": "enforced: none (--network none) unless the job asks and its queue allows",
        "memory": (
            f"enforced by the cgroup {version} memory controller (--memory; OOM kills classed oom)"
            if "memory" in controllers
            else "NOT enforced: no cgroup memory controller on this host"
        ),
        "cpu": (
            f"enforced by the cgroup {version} cpu controller (--cpus, CFS quota)"
            if "cpu" in controllers
            else "NOT enforced: no cgroup cpu controller on this host"
        ),
        "identity": (
            "enforced: each tenant runs under its own uid and gid (--user), without "
            "capabilities, and owns its working directory"
            if root
            else "NOT enforced: the server is not root, so containers cannot run under "
            "tenants' uids"
        ),
        "devices": (
            "enforced: only the replica's GPUs (--device or CDI), renumbered from 0"
            if runtime.gpu_devices == "cdi" or cdi_available() or gpu_device_nodes(devices_at)
            else f"none to enforce: no GPU device node under {devices_at} (virtual GPUs)"
        ),
    }
    return Probe(problems=problems, enforced=enforced)


PROCESS_ENFORCEMENT = {
    "image": "none: plain processes; jobs naming an image are refused",
    "mounts": "none: plain processes see the host; jobs with mounts are refused",
    "network": "NOT enforced: plain processes share the host's network",
    "memory": "RLIMIT_AS on replicas without GPUs only",
    "cpu": "NOT enforced",
    "identity": "NOT enforced: every replica runs as the server's user",
    "devices": "CUDA_VISIBLE_DEVICES only (a process can still open other GPUs)",
}
"""What ``runtime: process`` enforces."""
