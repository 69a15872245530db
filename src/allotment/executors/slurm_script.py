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
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allotment.executors.base import LaunchRequest

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
        if request.container is not None:
            raise UnsupportedRequest(
                f"replica {request.key} should run in a container; the Slurm executor "
                "runs plain processes only"
            )
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
