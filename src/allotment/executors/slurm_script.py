"""What Allotment submits to Slurm for one attempt: the ``sbatch`` options that pin
Allotment's placement, the batch script, and the per-node launcher.

An attempt is one Slurm job over the nodes Allotment chose (``--nodelist``, ``-N``),
with one task per node (``--ntasks-per-node=1``) holding the sum of that node's replicas
(``--cpus-per-task``, ``--mem``, ``--gres=gpu:TYPE:N``). The batch script runs the
launcher once per node with ``srun``; the launcher starts the node's replicas, gives
each its share of the node's ``CUDA_VISIBLE_DEVICES`` (as Slurm bound them), its
environment, working directory and log files, forwards a stop signal to them and exits
with the first non-zero exit code. When the nodes' shares differ, the attempt is a
heterogeneous job: one component per node, each with its own share.

Containers (``executor.runtime.kind: podman``): the launcher runs each replica with the
``podman run`` the local executor would use (:func:`.containers.podman_run`), with what
only the node knows filled in there: the ``--device`` options of the GPUs Slurm bound
(``SLURM_STEP_GPUS``), the node's ``nofile`` and ``nproc`` limits, and
``ALLOTMENT_HOST_DEVICES``. Before the first start it checks the image (pulling it
when the runtime allows); a missing image, or a container Podman could not create,
leaves an ``image-error`` file in the attempt's directory (failure class ``image``), an
OOM kill an ``oom`` file. A stop signal is forwarded with ``podman kill --signal``;
the containers are killed once the grace period written by the executor (``stop``), or
half of Slurm's ``KillWait`` for a stop Allotment did not ask for, has passed, so that
Slurm's SIGKILL never finds one running; every container is removed at the end.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from allotment.domain.executor import RuntimeSpec
from allotment.executors.base import LaunchRequest, ReplicaKey
from allotment.executors.containers import (
    CDI_DIRS,
    GPU_CONTROL_NODES,
    NOFILE_CAP,
    NPROC_CAP,
    PodmanRun,
    container_name,
    podman_base,
    podman_run,
)
from allotment.executors.slurm_records import IMAGE_ERROR_FILE, OOM_FILE, STOP_FILE

MIB = 1 << 20
BASE_EXPORTS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "TMPDIR")
"""Server environment variables every job gets (``--export``); the rest is withheld."""


class UnsupportedRequest(ValueError):
    """A launch Slurm cannot run as Allotment placed it."""


@dataclass(frozen=True, slots=True)
class NodeShare:
    """What one node holds of an attempt: its replicas and their summed resources."""

    node: str
    replicas: tuple[LaunchRequest, ...]
    gpus: int
    cpus: int
    memory_mb: int

    def options(self, gres_type: str | None) -> list[str]:
        out = [
            f"--cpus-per-task={self.cpus}",
            f"--mem={self.memory_mb}M",
        ]
        if self.gpus:
            kind = f"{gres_type}:" if gres_type else ""
            out.append(f"--gres=gpu:{kind}{self.gpus}")
        return out


def _gpus(request: LaunchRequest) -> int:
    return len(request.devices)


def node_shares(requests: Sequence[LaunchRequest]) -> list[NodeShare]:
    """The attempt's replicas grouped by node, in order of first appearance."""
    by_node: dict[str, list[LaunchRequest]] = {}
    for request in requests:
        if request.node is None:
            raise UnsupportedRequest(f"replica {request.key} has no node")
        by_node.setdefault(request.node, []).append(request)
    shares = []
    for node, replicas in by_node.items():
        cpu_millis = sum(r.cpu_millis or 0 for r in replicas)
        memory = sum(r.memory_bytes or 0 for r in replicas)
        shares.append(
            NodeShare(
                node=node,
                replicas=tuple(replicas),
                gpus=sum(_gpus(r) for r in replicas),
                cpus=max(1, math.ceil(cpu_millis / 1000)),
                memory_mb=max(1, math.ceil(memory / MIB)),
            )
        )
    return shares


def is_uniform(shares: Sequence[NodeShare], gres_types: Mapping[str, str | None]) -> bool:
    """Whether every node holds the same share (one plain job; else a heterogeneous one)."""
    return len({(s.gpus, s.cpus, s.memory_mb, gres_types.get(s.node)) for s in shares}) == 1


def sbatch_argv(
    *,
    shares: Sequence[NodeShare],
    gres_types: Mapping[str, str | None],
    partition: str,
    name: str,
    comment: str,
    output: str,
    workdir: str,
    exports: Sequence[str],
    max_runtime: float | None,
    account: str | None,
    qos: str | None,
    script: str,
) -> list[str]:
    """``sbatch`` options that pin the placement (without the command name)."""
    common = [
        "--parsable",
        f"--job-name={name}",
        f"--comment={comment}",
        "--no-requeue",
        f"--export={','.join(exports)}",
        f"--output={output}",
        f"--chdir={workdir}",
    ]
    if account:
        common.append(f"--account={account}")
    if qos:
        common.append(f"--qos={qos}")
    if max_runtime is not None:
        common.append(f"--time={max(1, math.ceil(max_runtime / 60))}")
    if is_uniform(shares, gres_types):
        nodes = ",".join(s.node for s in shares)
        first = shares[0]
        return [
            *common,
            f"--partition={partition}",
            f"--nodelist={nodes}",
            f"--nodes={len(shares)}",
            "--ntasks-per-node=1",
            *first.options(gres_types.get(first.node)),
            script,
        ]
    argv = list(common)
    for i, share in enumerate(shares):
        if i:
            argv.append(":")
        argv += [
            f"--partition={partition}",
            f"--nodelist={share.node}",
            "--nodes=1",
            "--ntasks-per-node=1",
            *share.options(gres_types.get(share.node)),
        ]
    argv.append(script)
    return argv


def batch_script(launcher: str, components: int, result: str) -> str:
    """The batch script: the launcher once on every node of the job (every component
    of a heterogeneous job), then ``<exit code> <start> <end>`` written to ``result``,
    so that how the attempt ended is known even after Slurm forgets the job."""
    group = f" --het-group=0-{components - 1}" if components > 1 else ""
    result = shlex.quote(result)
    return (
        "#!/bin/sh\n"
        "# Written by Allotment: runs the attempt's launcher once per node.\n"
        "start=$(date +%s)\n"
        f"srun{group} --ntasks-per-node=1 --kill-on-bad-exit=0 /bin/bash {shlex.quote(launcher)}\n"
        "rc=$?\n"
        f'printf "%s %s %s\\n" "$rc" "$start" "$(date +%s)" > {result}.tmp\n'
        f"mv {result}.tmp {result}\n"
        'exit "$rc"\n'
    )


def _replica_lines(request: LaunchRequest, first_gpu: int) -> list[str]:
    env = "".join(
        f"export {name}={shlex.quote(value)}; " for name, value in sorted(request.env.items())
    )
    count = _gpus(request)
    devices = f'"$(slice {first_gpu} {count})"' if count else "''"
    command = " ".join(shlex.quote(part) for part in request.command)
    stdout = shlex.quote(str(request.stdout_path or "/dev/null"))
    stderr = shlex.quote(str(request.stderr_path or "/dev/null"))
    workdir = shlex.quote(str(request.workdir))
    return [
        f"  ( export CUDA_VISIBLE_DEVICES={devices}; {env}",
        f"    cd {workdir} && exec {command} >{stdout} 2>{stderr} ) &",
        '  pids+=("$!")',
    ]


def launcher_script(shares: Sequence[NodeShare], stop_signal: str) -> str:
    """The per-node launcher (bash): starts the replicas placed on ``$SLURMD_NODENAME``."""
    lines = [
        "#!/bin/bash",
        "# Written by Allotment: starts this node's replicas of one attempt.",
        'IFS=, read -r -a GPUS <<< "${CUDA_VISIBLE_DEVICES:-}"',
        'slice() { local IFS=,; echo "${GPUS[*]:$1:$2}"; }',
        "pids=()",
        f"trap 'kill -{stop_signal} \"${{pids[@]}}\" 2>/dev/null' {stop_signal}",
        'case "$SLURMD_NODENAME" in',
    ]
    for share in shares:
        lines.append(f"{shlex.quote(share.node)})")
        offset = 0
        for request in share.replicas:
            lines += _replica_lines(request, offset)
            offset += _gpus(request)
        lines.append("  ;;")
    lines += [
        '*) echo "allotment: no replica placed on node $SLURMD_NODENAME" >&2; exit 97 ;;',
        "esac",
        "status=0",
        'for pid in "${pids[@]}"; do',
        "  while :; do",
        '    wait "$pid"; rc=$?',
        '    kill -0 "$pid" 2>/dev/null || break',
        "  done",
        '  if [ "$status" -eq 0 ] && [ "$rc" -ne 0 ]; then status=$rc; fi',
        "done",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- containers

DEVICES = "\0devices"
"""Where a container's ``--device`` options go: the launcher builds them on its node."""
NOFILE = "\0nofile"
NPROC = "\0nproc"
_SHELL_VARIABLES = {NOFILE: "${NOFILE}", NPROC: "${NPROC}", DEVICES: "${DEV[@]}"}
HOST_ENV = ("ALLOTMENT_HOST_DEVICES", "SLURM_JOB_ID", "SLURMD_NODENAME")
"""Variables a container gets from its node (the GPUs Slurm bound, Slurm's job id and
node name) rather than from its environment file."""
KILL_AFTER_S = 15.0
"""How long a container may take to stop after a signal Allotment did not send, when
Slurm's ``KillWait`` is not known."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerPlan:
    """How an attempt's replicas run as containers: the runtime, the attempt's
    directory on the shared file system (environment files, ``stop`` and the markers),
    each replica's ``podman run`` (:func:`container_run`), and how long a container
    may take to stop on a signal from Slurm itself (``kill_after``)."""

    runtime: RuntimeSpec
    directory: str
    runs: Mapping[ReplicaKey, PodmanRun]
    kill_after: float = KILL_AFTER_S


def env_file_path(directory: str, key: ReplicaKey) -> str:
    """Where a container replica's environment file is (mode 0600)."""
    return str(PurePosixPath(directory) / f"{container_name(key)}.env")


def container_run(runtime: RuntimeSpec, request: LaunchRequest, directory: str) -> PodmanRun:
    """A container replica's ``podman run`` as its node's launcher runs it: devices and
    ulimits learnt on the node, the environment file in ``directory``, the signals
    forwarded by the launcher (not by Podman, which Slurm signals too and which then
    leaves), and the container writing to the replica's logs itself."""
    return podman_run(
        runtime,
        request,
        env_file=env_file_path(directory, request.key),
        device_args=[DEVICES],
        ulimits=(NOFILE, NPROC),
        host_env=HOST_ENV,
        sig_proxy=False,
        passthrough_logs=True,
    )


def _shell_word(part: str) -> str:
    """One word of a ``podman run`` option: quoted, with the launcher's own variables
    (:data:`NOFILE`, :data:`NPROC`, :data:`DEVICES`) expanded."""
    if "\0" not in part:
        return shlex.quote(part)
    text = part
    for special in ("\\", '"', "$", "`"):
        text = text.replace(special, "\\" + special)
    for placeholder, variable in _SHELL_VARIABLES.items():
        text = text.replace(placeholder, variable)
    if "\0" in text:
        raise ValueError(f"unknown placeholder in {part!r}")
    return f'"{text}"'


def _run_words(run: PodmanRun, request: LaunchRequest) -> str:
    """``run.argv`` for bash: options with the launcher's variables, then the image and
    the command quoted as written."""
    tail = len(request.command) + 1
    options, rest = run.argv[:-tail], run.argv[-tail:]
    return " ".join([*(_shell_word(p) for p in options), *(shlex.quote(p) for p in rest)])


def _container_lines(request: LaunchRequest, first_gpu: int, plan: ContainerPlan) -> list[str]:
    run = plan.runs[request.key]
    count = _gpus(request)
    devices = f"$(slice {first_gpu} {count})" if count else ""
    stdout = shlex.quote(str(request.stdout_path or "/dev/null"))
    stderr = shlex.quote(str(request.stderr_path or "/dev/null"))
    limited = 1 if request.memory_bytes else 0
    return [
        '  if [ "$stopping" = 0 ]; then',
        f'    hostdevs="{devices}"; devices "$hostdevs"',
        f'    "${{PODMAN[@]}}" rm --force --ignore {shlex.quote(run.name)} >/dev/null 2>&1',
        f"    names+=({shlex.quote(run.name)}); limited+=({limited})",
        f'    ALLOTMENT_HOST_DEVICES="$hostdevs" {_run_words(run, request)} \\',
        f"      </dev/null >{stdout} 2>{stderr} &",
        '    pids+=("$!")',
        "  fi",
    ]


def _container_prelude(stop_signal: str, plan: ContainerPlan) -> list[str]:
    runtime = plan.runtime
    device_dir = str(PurePosixPath(runtime.device_dir))
    if runtime.gpu_devices == "auto":
        specs = " ".join(
            f"{shlex.quote(d)}/nvidia*.{ext}" for d in CDI_DIRS for ext in ("yaml", "json")
        )
        cdi = [f'CDI=0; for f in {specs}; do [ -e "$f" ] && CDI=1; done']
    else:
        cdi = [f"CDI={1 if runtime.gpu_devices == 'cdi' else 0}"]
    control = " ".join(GPU_CONTROL_NODES)
    kill_after = f"{max(1.0, plan.kill_after):g}"
    signals = list(dict.fromkeys([stop_signal, "TERM", "INT"]))
    pull = (
        [
            '  if out=$("${PODMAN[@]}" pull --quiet "$image" 2>&1); then return 0; fi',
            '  out=$(printf "%s\\n" "$out" | tail -n 1)',
            '  image_error "image $image could not be pulled on $SLURMD_NODENAME: $out" "$@"',
        ]
        if runtime.pull == "missing"
        else [
            '  image_error "image $image is not on node $SLURMD_NODENAME '
            '(and the runtime pulls never)" "$@"'
        ]
    )
    return [
        "#!/bin/bash",
        "# Written by Allotment: starts this node's replicas of one attempt as containers.",
        f"DIR={shlex.quote(plan.directory)}",
        f"PODMAN=({' '.join(shlex.quote(p) for p in podman_base(runtime))})",
        f"DEVICE_DIR={shlex.quote(device_dir)}",
        'IFS=, read -r -a GPUS <<< "${SLURM_STEP_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"',
        'slice() { local IFS=,; echo "${GPUS[*]:$1:$2}"; }',
        'hard() { local v; v=$(ulimit -H "$1");'
        ' if [ "$v" = unlimited ] || [ "$v" -gt "$2" ]; then echo "$2"; else echo "$v"; fi; }',
        f"NOFILE=$(hard -n {NOFILE_CAP}); NPROC=$(hard -u {NPROC_CAP})",
        *cdi,
        "devices() {  # DEV: the --device options of the host GPUs in $1",
        "  DEV=(); local d n",
        "  for d in ${1//,/ }; do",
        '    if [ "$CDI" = 1 ]; then DEV+=(--device "nvidia.com/gpu=$d")',
        '    else DEV+=(--device "$DEVICE_DIR/nvidia$d:/dev/nvidia$d"); fi',
        "  done",
        '  if [ -n "$1" ] && [ "$CDI" != 1 ]; then',
        f"    for n in {control}; do",
        '      if [ -e "$DEVICE_DIR/$n" ]; then DEV+=(--device "$DEVICE_DIR/$n:/dev/$n"); fi',
        "    done",
        "  fi",
        "}",
        "mark() {  # FILE TEXT: written whole, for the server to read",
        '  local tmp="$DIR/.$1.$SLURMD_NODENAME.$$"',
        '  printf "%s\\n" "$2" >"$tmp" && mv -f "$tmp" "$DIR/$1"',
        "}",
        "image_error() {  # TEXT STDERR...",
        "  local text=$1 f; shift",
        '  for f in "$@"; do printf "allotment: %s\\n" "$text" >>"$f"; done',
        f'  mark {IMAGE_ERROR_FILE} "$text"',
        "}",
        "prepare() {  # IMAGE STDERR...: the image is on this node (pulled when allowed)",
        "  local image=$1 out; shift",
        '  "${PODMAN[@]}" image exists "$image" && return 0',
        *pull,
        "  return 1",
        "}",
        "pids=(); names=(); limited=(); stopping=0; timer=",
        "kill_all() {  # SIGNAL",
        "  [ ${#names[@]} -eq 0 ] ||",
        '    "${PODMAN[@]}" kill --signal "$1" "${names[@]}" >/dev/null 2>&1',
        "}",
        'say() { echo "allotment: $SLURMD_NODENAME: $*" >&2; }',
        "on_signal() {  # forward a stop; kill when its grace has passed or on a second one",
        '  if [ "$stopping" = 1 ]; then say "SIG$1 again: killing"; kill_all KILL; return; fi',
        "  stopping=1",
        '  kill_all "$1"',
        f'  local grace; grace=$(cat "$DIR/{STOP_FILE}" 2>/dev/null)',
        f'  case "$grace" in ""|*[!0-9.]*) grace={kill_after} ;; esac',
        '  say "SIG$1 forwarded to ${#names[@]} container(s), killed after ${grace}s"',
        f"  ( trap '' {' '.join(signals)}; sleep \"$grace\"; kill_all KILL ) &",
        "  timer=$!",
        "}",
        *(f"trap 'on_signal {s}' {s}" for s in signals),
        f'if [ -e "$DIR/{STOP_FILE}" ]; then stopping=1; fi  # stopped before it started',
    ]


def _container_finish() -> list[str]:
    return [
        "finish() {  # INDEX: wait for the replica's container; its exit status in rc",
        "  local i=$1 name=${names[$1]} pid=${pids[$1]} state w",
        '  while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done',
        "  # Slurm signals Podman too, which then leaves: wait for the container itself.",
        "  while :; do",
        '    state=$("${PODMAN[@]}" inspect --format'
        " '{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}' \"$name\" 2>/dev/null)",
        '    case "$state" in running*|stopping*|paused*) ;; *) break ;; esac',
        '    "${PODMAN[@]}" wait "$name" >/dev/null 2>&1 & w=$!',
        '    while kill -0 "$w" 2>/dev/null; do wait "$w"; done',
        '    wait "$w" || sleep 1',
        "  done",
        '  case "$state" in',
        "    exited*)",
        "      set -- $state; rc=$2",
        f'      if [ "$3" = true ]; then mark {OOM_FILE} "$name"; fi ;;',
        '    *) if [ "$rc" -eq 125 ] && [ "$stopping" = 0 ]; then',
        '         image_error "the container could not be created or started on'
        " $SLURMD_NODENAME (see the replica's stderr)\"",
        "       fi ;;",
        "  esac",
        '  if [ "$rc" -eq 137 ] && [ "$stopping" = 0 ] && [ "${limited[$i]}" = 1 ]; then',
        f'    mark {OOM_FILE} "$name"  # cgroup v1 hosts do not always say OOMKilled',
        "  fi",
        '  "${PODMAN[@]}" rm --force --ignore "$name" >/dev/null 2>&1',
        "}",
        "# Each replica as it ends (a container that could not start is said at once);",
        "# the last one is simply waited for.",
        'status=0; left=("${!pids[@]}")',
        "while [ ${#left[@]} -gt 0 ]; do",
        "  still=()",
        '  for i in "${left[@]}"; do',
        '    if [ ${#left[@]} -gt 1 ] && kill -0 "${pids[$i]}" 2>/dev/null; then',
        '      still+=("$i"); continue',
        "    fi",
        '    finish "$i"',
        '    if [ "$status" -eq 0 ] && [ "$rc" -ne 0 ]; then status=$rc; fi',
        "  done",
        '  left=("${still[@]}")',
        "  if [ ${#left[@]} -gt 0 ]; then sleep 1 & wait $!; fi",
        "done",
        'if [ -n "$timer" ]; then kill -KILL "$timer" 2>/dev/null; fi',
        "# Stopped before anything started: not a success.",
        'if [ ${#pids[@]} -eq 0 ] && [ "$stopping" = 1 ]; then status=143; fi',
        'exit "$status"',
    ]


def container_launcher(shares: Sequence[NodeShare], stop_signal: str, plan: ContainerPlan) -> str:
    """The per-node launcher (bash) of an attempt that runs as containers."""
    lines = _container_prelude(stop_signal, plan)
    lines.append('case "$SLURMD_NODENAME" in')
    for share in shares:
        lines.append(f"{shlex.quote(share.node)})")
        errors = " ".join(shlex.quote(str(r.stderr_path or "/dev/null")) for r in share.replicas)
        images = dict.fromkeys(r.container.image for r in share.replicas if r.container)
        for image in images:
            lines.append(f"  prepare {shlex.quote(image)} {errors} || exit 125")
        offset = 0
        for request in share.replicas:
            lines += _container_lines(request, offset, plan)
            offset += _gpus(request)
        lines.append("  ;;")
    lines += [
        '*) echo "allotment: no replica placed on node $SLURMD_NODENAME" >&2; exit 97 ;;',
        "esac",
        *_container_finish(),
    ]
    return "\n".join(lines) + "\n"
