"""The Slurm executor: Allotment decides, Slurm runs.

Allotment keeps the queues, quotas, priorities, preemption and explanations; each
admitted attempt becomes one Slurm job pinned to the nodes Allotment chose (see
:mod:`.slurm_script`). Slurm is the source of truth for what runs: every job carries the
Allotment job id and attempt in its name and comment, so a restarted server finds its
jobs with one ``squeue --json`` and adopts them instead of submitting them again.

One ``squeue --json`` per :meth:`SlurmExecutor.observe` and one ``scontrol show node -o``
per :meth:`SlurmExecutor.nodes` (each cycle), never one call per job. Stops send
``stop_signal`` to the job's steps (``scancel --signal``) and, after the grace period,
cancel the job (Slurm's ``KillWait`` then ends it with SIGKILL). Jobs are submitted with
``--no-requeue``: a job that fails is requeued by Allotment's retry policy, never by
Slurm.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from allotment.domain.cluster import Cluster, Node
from allotment.domain.executor import SlurmSettings
from allotment.executors.base import (
    Executor,
    GpuInfo,
    LaunchRequest,
    ReplicaKey,
    ReplicaStatus,
)
from allotment.executors.slurm_parse import (
    SlurmJob,
    SlurmNode,
    comment_for,
    config_problems,
    gres_type_of,
    job_name,
    key_values,
    parse_config,
    parse_jobs,
    parse_nodes,
    pool_of,
    status_of,
    to_nodes,
)
from allotment.executors.slurm_script import (
    BASE_EXPORTS,
    UnsupportedRequest,
    batch_script,
    is_uniform,
    launcher_script,
    node_shares,
    sbatch_argv,
)

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 30.0
FINALS_KEPT_S = 3600.0


class SlurmError(OSError):
    """A Slurm command failed; the message holds its output."""


class SlurmExecutor(Executor):
    """Runs attempts as Slurm jobs, as configured by ``executor.slurm`` in
    ``cluster.yaml``. ``clock`` is for tests."""

    def __init__(
        self,
        settings: SlurmSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, int], SlurmJob] = {}
        """Allotment's jobs in Slurm as of the last ``squeue``, by (job, attempt)."""
        self._finals: dict[ReplicaKey, tuple[ReplicaStatus, float]] = {}
        """How ended jobs ended (and when that was seen), kept for
        :data:`FINALS_KEPT_S` after Slurm forgets them."""
        self._stops: dict[int, float] = {}
        """Slurm job id → when its grace period ends (a stop was asked)."""
        self._launched: dict[tuple[str, int], tuple[int, float]] = {}
        """The Slurm job id and submission time of each attempt this executor submitted
        (for idempotence and the pending timeout)."""
        self._observed = False
        """Whether a full ``squeue`` has been read (then ``_jobs`` knows every job
        submitted before this executor started)."""
        self._gres: dict[str, str | None] = {}
        """Node → GRES type to request there, from the last inventory."""

    # ------------------------------------------------------------------ commands

    def _argv(self, command: str, *args: str) -> list[str]:
        bin_dir = self.settings.bin_dir
        program = str(Path(bin_dir) / command) if bin_dir else command
        return [*self.settings.command_prefix, program, *args]

    def run(self, command: str, *args: str, stdin: str | None = None) -> str:
        """Run one Slurm command; its stdout, or :class:`SlurmError`."""
        argv = self._argv(command, *args)
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{command}: {exc}") from exc
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmError(f"{command} failed: {message[-1] if message else done.returncode}")
        return done.stdout

    # ------------------------------------------------------------------ start-up

    def check(self) -> list[str]:
        """Whether Slurm is reachable and configured so that it never reorders, preempts,
        requeues or over-commits what Allotment placed."""
        try:
            config = parse_config(self.run("scontrol", "show", "config"))
        except SlurmError as exc:
            where = self.settings.bin_dir or "PATH"
            return [f"cannot reach Slurm ({exc}); check executor.slurm.bin_dir ({where})"]
        try:
            line = self.run("scontrol", "show", "partition", self.settings.partition, "-o")
            partition = key_values(line.strip()) if line.strip() else None
        except SlurmError:
            partition = None
        problems = [f"Slurm: {p}" for p in config_problems(config, partition)]
        try:
            slurm_nodes = parse_nodes(self.run("scontrol", "show", "node", "-o"))
        except SlurmError as exc:
            return [*problems, f"cannot list Slurm's nodes: {exc}"]
        mapped = [n for n in slurm_nodes if pool_of(n, self.settings) is not None]
        if not mapped:
            problems.append(
                "no Slurm node matches executor.slurm.pools: check the gres_type, feature "
                "and partition of each pool against `scontrol show node`"
            )
        outside = [
            n.name for n in mapped if self.settings.partition not in n.partitions and n.partitions
        ]
        if outside:
            problems.append(
                f"nodes {', '.join(sorted(outside))} map to a pool but are not in partition "
                f"{self.settings.partition}: add them to it or narrow the pool's rule"
            )
        return problems

    # ------------------------------------------------------------------ inventory

    def slurm_nodes(self) -> list[SlurmNode]:
        return parse_nodes(self.run("scontrol", "show", "node", "-o"))

    def nodes(self, cluster: Cluster) -> dict[str, Node] | None:
        """Slurm's nodes that map to a pool, with their health; on a failed call, the
        cluster's nodes marked unhealthy is wrong, so the previous answer stands
        (``None``: nothing new)."""
        try:
            slurm_nodes = self.slurm_nodes()
        except SlurmError as exc:
            log.warning("cannot read Slurm's nodes: %s", exc)
            return None
        self._learn_gres(slurm_nodes)
        return to_nodes(slurm_nodes, self.settings)

    def _learn_gres(self, slurm_nodes: Sequence[SlurmNode]) -> None:
        gres: dict[str, str | None] = {}
        for node in slurm_nodes:
            pool = pool_of(node, self.settings)
            if pool is not None:
                gres[node.name] = gres_type_of(node, self.settings, pool)
        with self._lock:
            self._gres = gres

    def inventory(self) -> list[GpuInfo]:
        """The GPUs of every mapped node, numbered across nodes in node order."""
        out: list[GpuInfo] = []
        try:
            slurm_nodes = self.slurm_nodes()
        except SlurmError:
            return out
        for node in to_nodes(slurm_nodes, self.settings).values():
            for device in node.devices:
                out.append(GpuInfo(index=len(out), model=device.model, source="slurm"))
        return out

    # ------------------------------------------------------------------ launch

    def launch(self, request: LaunchRequest) -> str:
        return self.launch_all([request])[0]

    def launch_all(self, requests: Sequence[LaunchRequest]) -> list[str]:
        """Submit the attempt as one Slurm job unless Slurm already has it; every
        replica's handle is the Slurm job id."""
        if not requests:
            return []
        first = requests[0]
        if any((r.job_id, r.attempt) != (first.job_id, first.attempt) for r in requests):
            raise ValueError("launch_all takes the replicas of one attempt")
        attempt = (first.job_id, first.attempt)
        existing = self._find(first.job_id, first.attempt)
        if existing is not None:
            return [str(existing)] * len(requests)
        try:
            shares = node_shares(requests)
        except UnsupportedRequest as exc:
            raise SlurmError(str(exc)) from exc
        if not self._gres:
            self._learn_gres(self.slurm_nodes())
        slurm_dir = Path(first.workdir) / "slurm"
        slurm_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        launcher = slurm_dir / "launch.sh"
        launcher.write_text(launcher_script(shares, self.settings.stop_signal))
        script = slurm_dir / "batch.sh"
        uniform = is_uniform(shares, self._gres)
        script.write_text(batch_script(str(launcher), 1 if uniform else len(shares)))
        runtimes = [r.max_runtime for r in requests if r.max_runtime is not None]
        argv = sbatch_argv(
            shares=shares,
            gres_types=self._gres,
            partition=self.settings.partition,
            name=job_name(*attempt),
            comment=comment_for(first.job_id, first.attempt, [r.key for r in requests]),
            output=str(slurm_dir / "slurm-%j.out"),
            workdir=str(first.workdir),
            exports=self._exports(),
            max_runtime=max(runtimes) if runtimes else None,
            account=self.settings.account,
            qos=self.settings.qos,
            script=str(script),
        )
        out = self.run("sbatch", *argv).strip()
        slurm_id = int(out.split(";", 1)[0])
        with self._lock:
            self._launched[attempt] = (slurm_id, self.clock())
        log.info("submitted %s/%s as Slurm job %s", first.job_id, first.attempt, slurm_id)
        return [str(slurm_id)] * len(requests)

    def _exports(self) -> list[str]:
        return list(dict.fromkeys([*BASE_EXPORTS, *self.settings.export_env]))

    def _find(self, job_id: str, attempt: int) -> int | None:
        """The Slurm job of an attempt, asking Slurm when this executor has not seen it
        (a restart between ``sbatch`` and the store's update)."""
        with self._lock:
            known = self._jobs.get((job_id, attempt))
            submitted = self._launched.get((job_id, attempt))
            observed = self._observed
        if known is not None:
            return known.slurm_id
        if submitted is not None:
            return submitted[0]
        if observed:
            return None
        out = self.run(
            "squeue", "-h", "-t", "all", f"--name={job_name(job_id, attempt)}", "-o", "%i"
        )
        ids = [int(w) for w in out.split() if w.isdigit()]
        return min(ids) if ids else None

    # ------------------------------------------------------------------ observe

    def observe(self) -> dict[ReplicaKey, ReplicaStatus]:
        """Every replica of every Allotment job Slurm knows (one ``squeue --json``),
        plus how the jobs Slurm has forgotten ended. Stops past their grace period are
        escalated, and jobs that cannot start are cancelled in Slurm."""
        document = json.loads(self.run("squeue", "--json"))
        jobs = parse_jobs(document)
        now = self.clock()
        out: dict[ReplicaKey, ReplicaStatus] = {}
        to_cancel: list[int] = []
        with self._lock:
            self._jobs = {(j.job_id, j.attempt): j for j in jobs}
            self._observed = True
            for key, (status, seen) in list(self._finals.items()):
                if now - seen > FINALS_KEPT_S:
                    del self._finals[key]
                else:
                    out[key] = status
            for job in jobs:
                attempt = (job.job_id, job.attempt)
                stopping = job.slurm_id in self._stops
                submitted = self._launched.get(attempt)
                pending_since = submitted[1] if submitted else job.submit_time or now
                status = status_of(
                    job,
                    now=now,
                    stop_requested=stopping,
                    pending_since=pending_since,
                    timeout=self.settings.pending_timeout,
                )
                if status.ended:
                    self._stops.pop(job.slurm_id, None)
                    if job.state in ("PENDING", "CONFIGURING"):
                        to_cancel.append(job.slurm_id)
                elif stopping and now >= self._stops[job.slurm_id]:
                    to_cancel.append(job.slurm_id)
                    self._stops[job.slurm_id] = float("inf")
                for key in job.keys:
                    out[key] = status
                    if status.ended:
                        self._finals[key] = (status, now)
        for slurm_id in to_cancel:
            self._cancel(slurm_id)
        return out

    # ------------------------------------------------------------------ stop

    def stop(self, key: ReplicaKey, grace_s: float) -> None:
        """Send ``stop_signal`` to the attempt's steps (a pending job is cancelled at
        once); the job is cancelled when ``grace_s`` has passed. One stop per attempt:
        the other replicas of a gang share its Slurm job."""
        with self._lock:
            job = self._jobs.get((key.job_id, key.attempt))
            if job is None or job.slurm_id in self._stops:
                return
            self._stops[job.slurm_id] = self.clock() + grace_s
        if job.state in ("PENDING", "CONFIGURING"):
            self._cancel(job.slurm_id)
            return
        try:
            self.run("scancel", f"--signal={self.settings.stop_signal}", str(job.slurm_id))
        except SlurmError as exc:  # ended meanwhile, or Slurm unreachable: retried by then
            log.warning("could not signal Slurm job %s: %s", job.slurm_id, exc)
        if grace_s <= 0:
            self._cancel(job.slurm_id)

    def _cancel(self, slurm_id: int) -> None:
        try:
            self.run("scancel", str(slurm_id))
        except SlurmError as exc:
            log.warning("could not cancel Slurm job %s: %s", slurm_id, exc)
