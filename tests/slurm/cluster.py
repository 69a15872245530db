"""A real Slurm cluster for the tests: one ``slurmctld`` and three ``slurmd`` "nodes" on
this host, with fake GPU devices, inside a private network namespace.

Slurm 22.05 comes from Debian's packages, extracted (not installed) under a cache
directory. The daemons bind every address, so they run in a network namespace of their
own that holds only loopback: a ``holder`` process (``unshare -n``) keeps the namespace,
and everything that talks to Slurm enters it with ``nsenter``. The cluster writes
wrappers for the client commands (``sbatch``, ``squeue``, ``scontrol``, ``scancel``,
``sinfo``) into ``bin/``, so that Allotment's Slurm executor runs them with
``bin_dir: <bin>`` as it would on a submit host.

Pitfalls (each found the hard way): the daemons must run under the names ``slurmctld``
and ``slurmd`` (under other names Slurm drops every ``Gres=`` line); ``slurmd`` needs
``-d <slurmstepd>``; ``gres.conf`` ``File=`` must name a device node (``mknod … c 1 3``
fakes one); a loopback-only namespace needs a second address (127.0.0.2) or the daemons
cannot resolve their own host; each node has an address of its own in 127.0.0.0/8
(``NodeAddr``, :func:`node_address`), as on a real network; no accounting daemon, so
``squeue --json`` and ``scontrol`` are the only sources; and every daemon is killed by
PID on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurm-wlm-basic-plugins",
    "libhwloc15",
    "liblua5.1-0",
    "libmunge2",
)
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
NODES = {"gpu-node1": ("a100", 4), "gpu-node2": ("a100", 4), "gpu-node3": ("h100", 2)}
"""Node name → (GPU type, GPU count)."""
NODE_CPUS = 8
NODE_MEMORY_MB = 16000
NODE_MARKER = "ALLOTMENT_TEST_SLURM_NODE"
"""In a node's ``slurmd`` environment (and so its ``slurmstepd``'s): what the harness kills."""
CTLD_PORT = 16817
FIRST_NODE_PORT = 17001


def node_address(i: int) -> str:
    """The address of the ``i``-th node (``NodeAddr``): each its own in 127.0.0.0/8,
    which the namespace's loopback answers, so a gang's ``MASTER_ADDR`` names a node."""
    return f"127.0.0.{11 + i}"


DEFAULT_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "slurm"


def missing_tools() -> list[str]:
    """What this machine lacks to run the cluster (empty when it can)."""
    missing = [t for t in ("apt-get", "dpkg", "unshare", "nsenter", "ip") if not shutil.which(t)]
    if os.geteuid() != 0:
        missing.append("root (for network namespaces and device nodes)")
    return missing


def install(cache: Path = DEFAULT_CACHE) -> Path:
    """Slurm's binaries extracted under ``cache/root`` (downloaded once)."""
    root = cache / "root"
    if (root / "usr" / "sbin" / "slurmctld-wlm").exists():
        return root
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["apt-get", "download", *PACKAGES],
        cwd=debs,
        check=True,
        capture_output=True,
    )
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root


@dataclass
class SlurmCluster:
    """A running test cluster under ``base``; use :meth:`start` and :meth:`stop`."""

    base: Path
    root: Path
    holder: subprocess.Popen[bytes] | None = None
    ctld: subprocess.Popen[bytes] | None = None
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # ------------------------------------------------------------------ paths

    @property
    def bin_dir(self) -> Path:
        return self.base / "bin"

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"

    @property
    def lib_path(self) -> str:
        lib = self.root / "usr" / "lib" / "x86_64-linux-gnu"
        return f"{lib}:{lib / 'slurm-wlm'}"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.root}/usr/bin:{self.root}/usr/sbin:{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = self.lib_path
        env["SLURM_CONF"] = str(self.conf)
        return env

    def enter(self) -> list[str]:
        """The prefix that runs a command inside the cluster's network namespace."""
        assert self.holder is not None
        return ["nsenter", "-t", str(self.holder.pid), "-n", "--"]

    # ------------------------------------------------------------------ setup

    def _write_config(self) -> None:
        base = self.base
        for sub in ("etc", "log", "dev", "spool/ctld"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        for name in NODES:
            (base / "spool" / f"d-{name}").mkdir(parents=True, exist_ok=True)
        for i in range(max(count for _, count in NODES.values())):
            device = base / "dev" / f"nvidia{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))
        plugins = self.root / "usr" / "lib" / "x86_64-linux-gnu" / "slurm-wlm"
        lines = [
            "ClusterName=allotment-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={CTLD_PORT}",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"PluginDir={plugins}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={base}/spool/ctld",
            f"SlurmdSpoolDir={base}/spool/d-%n",
            f"SlurmctldPidFile={base}/log/slurmctld.pid",
            f"SlurmdPidFile={base}/log/slurmd-%n.pid",
            f"SlurmctldLogFile={base}/log/slurmctld.log",
            f"SlurmdLogFile={base}/log/slurmd-%n.log",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1",  # heterogeneous jobs start on a backfill pass
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "PreemptType=preempt/none",
            "GresTypes=gpu",
            "ReturnToService=2",
            "MinJobAge=300",
            "KillWait=2",
            "SlurmdTimeout=6",
            "HealthCheckInterval=0",
            "MessageTimeout=3",
        ]
        for i, (name, (kind, count)) in enumerate(NODES.items()):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr={node_address(i)} "
                f"Port={FIRST_NODE_PORT + i} CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} "
                f"Gres=gpu:{kind}:{count}"
            )
        lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        gres = ["AutoDetect=off"]
        for name, (kind, count) in NODES.items():
            gres.append(
                f"NodeName={name} Name=gpu Type={kind} File={base}/dev/nvidia[0-{count - 1}]"
            )
        (base / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")

    def _write_wrappers(self) -> None:
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        assert self.holder is not None
        for name in CLIENTS:
            wrapper = self.bin_dir / name
            wrapper.write_text(
                "#!/bin/sh\n"
                f"export PATH={self.root}/usr/bin:{self.root}/usr/sbin:$PATH\n"
                f"export LD_LIBRARY_PATH={self.lib_path}\n"
                f"export SLURM_CONF={self.conf}\n"
                f'exec nsenter -t {self.holder.pid} -n -- {self.root}/usr/bin/{name} "$@"\n'
            )
            wrapper.chmod(0o755)

    def _spawn(
        self, *argv: str, log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.log_dir / log).open("ab") as out:
            return subprocess.Popen(
                [*self.enter(), *argv],
                env={**self.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, timeout: float = 30.0) -> None:
        """Start the namespace, the controller and every node; wait until all are idle."""
        for name in ("slurmctld", "slurmd", "slurmstepd"):
            link = self.root / "usr" / "sbin" / name
            if not link.exists():
                link.symlink_to(f"{name}-wlm")
        self.holder = subprocess.Popen(
            [
                "unshare",
                "-n",
                "--",
                "sh",
                "-c",
                "ip link set lo up && ip addr add 127.0.0.2/8 dev lo && exec sleep infinity",
            ],
            start_new_session=True,
        )
        self._wait_for_netns()
        self._write_config()
        self._write_wrappers()
        sbin = self.root / "usr" / "sbin"
        self.ctld = self._spawn(str(sbin / "slurmctld"), "-D", "-i", log="ctld.out")
        for name in NODES:
            self.start_node(name)
        self.wait_idle(len(NODES), timeout)

    def _wait_for_netns(self) -> None:
        assert self.holder is not None
        for _ in range(100):
            done = subprocess.run(
                [*self.enter(), "ip", "-4", "addr", "show", "dev", "lo"],
                capture_output=True,
                text=True,
            )
            if "127.0.0.2" in done.stdout:
                return
            time.sleep(0.05)
        raise RuntimeError("the network namespace did not come up")

    def start_node(self, name: str) -> None:
        """Start (or restart) one node's ``slurmd``."""
        sbin = self.root / "usr" / "sbin"
        self.nodes[name] = self._spawn(
            str(sbin / "slurmd"),
            "-D",
            "-N",
            name,
            "-d",
            str(sbin / "slurmstepd"),
            log=f"{name}.out",
            env={NODE_MARKER: name},  # inherited by the slurmstepd it starts
        )

    def kill_node(self, name: str) -> None:
        """SIGKILL one node's ``slurmd`` and every job step it runs, as a dead machine.
        Everything is frozen first, ``slurmd`` before what it started, until nothing new
        of the node appears: a dead machine reports nothing, while a ``slurmstepd`` left
        running a moment (one just started, a step's or a batch script's) would tell
        Slurm its job failed (a user's failure) before Slurm noticed the node was gone."""
        process = self.nodes.pop(name)
        frozen: set[int] = set()
        found = {process.pid}
        while found:
            for group in found:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGSTOP)
            frozen |= found
            found = set(_steps_of(name)) - frozen
        for group in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``squeue``, …) inside the namespace."""
        return subprocess.run(
            [str(self.bin_dir / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def wait_idle(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if sum(1 for s in states.values() if s == "idle") >= count:
                return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm nodes not idle after {timeout}s: {states}; see {self.log_dir}")

    def stop(self) -> None:
        """Kill every daemon, job step and the namespace holder."""
        for name in list(self.nodes):
            self.kill_node(name)
        for name in NODES:
            for pid in _steps_of(name):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        if self.ctld is not None:
            _kill_group(self.ctld)
        if self.holder is not None:
            _kill_group(self.holder)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _steps_of(node: str) -> list[int]:
    """Process groups of what ``node``'s ``slurmd`` started: every ``slurmstepd`` (it
    inherits :data:`NODE_MARKER` from ``slurmd``) and every job process (its
    environment says ``SLURMD_NODENAME=<node>``)."""
    markers = {f"SLURMD_NODENAME={node}".encode(), f"{NODE_MARKER}={node}".encode()}
    groups: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if markers.isdisjoint((entry / "environ").read_bytes().split(b"\0")):
                continue
            groups.add(os.getpgid(int(entry.name)))
        except (OSError, ValueError):
            continue
    return sorted(groups)
