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

With ``executor.runtime.kind: podman`` each replica runs as a Podman container on its
node (see :mod:`.slurm_script`): the attempt's Slurm files, the replicas' environment
files (mode 0600) and what the launchers report (a missing image, an OOM kill) live in
``STATE_DIR/attempts/<job>-<attempt>/``, which the nodes must see at the same path (a
shared file system), and the attempt's working directory is handed to its tenant's uid.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

from allotment.domain.cluster import Cluster, Node
from allotment.domain.executor import RuntimeSpec, SlurmSettings
from allotment.executors.base import (
    Executor,
    GpuInfo,
    LaunchRequest,
    ReplicaKey,
    ReplicaPhase,
    ReplicaStatus,
)
from allotment.executors.containers import (
    Probe,
    probe,
)
from allotment.executors.slurm_containers import plan_containers, slurm_enforcement
from allotment.executors.slurm_parse import (
    PENDING_STATES,
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
from allotment.executors.slurm_records import (
    IMAGE_ERROR_FILE,
    OOM_FILE,
    RESULT_FILE,
    STOP_FILE,
    Record,
    Records,
    image_error,
    result_status,
    with_markers,
)
from allotment.executors.slurm_script import (
    BASE_EXPORTS,
    ContainerPlan,
    UnsupportedRequest,
    batch_script,
    container_launcher,
    is_uniform,
    launcher_script,
    node_shares,
    sbatch_argv,
)

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 30.0
RECORDS_KEPT_S = 7 * 86400.0
"""How long the record of an ended attempt is kept (the control loop closes the attempt
long before, unless it was down that long)."""
ATTEMPTS_DIR = "attempts"
"""Under the state directory: one directory per container attempt (see the module)."""
IMAGE_ERROR_EXIT = 125


class SlurmError(OSError):
    """A Slurm command failed; the message holds its output."""


class SlurmExecutor(Executor):
    """Runs attempts as Slurm jobs, as configured by ``executor.slurm`` in
    ``cluster.yaml``; what it submitted is recorded under ``state_dir``. ``runtime``
    says whether replicas run as plain processes (the default) or containers.
    ``clock`` is for tests."""

    def __init__(
        self,
        settings: SlurmSettings,
        state_dir: Path,
        *,
        runtime: RuntimeSpec | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.runtime = runtime or RuntimeSpec()
        self.clock = clock
        self._lock = threading.Lock()
        self.records = Records(state_dir)
        self.attempts_root = (Path(state_dir) / ATTEMPTS_DIR).absolute()
        """Where container attempts keep their files (see :meth:`attempt_dir`)."""
        self._kill_wait: float | None = None
        """Slurm's ``KillWait`` in seconds, once read."""
        self._addresses: dict[str, str] = {}
        """Node → how other nodes reach it, from the last inventory."""
        self._jobs: dict[int, SlurmJob] = {}
        """This executor's jobs in the last ``squeue``, by Slurm job id."""
        self._stops: dict[int, float] = {}
        """Slurm job id → when its grace period ends (a stop was asked)."""
        self._observed = False
        """Whether a full ``squeue`` has been read since this executor started (every
        job submitted before is then recorded)."""
        self._uid: int | None = None
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
        requeues or over-commits what Allotment placed; with containers, whether Podman
        works (on this machine: the nodes are not asked)."""
        runtime = self.probe().problems if self.runtime.containers else []
        try:
            config = parse_config(self.run("scontrol", "show", "config"))
        except SlurmError as exc:
            where = self.settings.bin_dir or "PATH"
            return [
                *runtime,
                f"cannot reach Slurm ({exc}); check executor.slurm.bin_dir ({where})",
            ]
        self._kill_wait = _seconds(config.get("KillWait"))
        try:
            line = self.run("scontrol", "show", "partition", self.settings.partition, "-o")
            partition = key_values(line.strip()) if line.strip() else None
        except SlurmError:
            partition = None
        problems = [*runtime, *(f"Slurm: {p}" for p in config_problems(config, partition))]
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

    def probe(self) -> Probe:
        """What Podman enforces, as this machine sees it (checked once)."""
        return probe(self.runtime)

    def enforcement(self) -> dict[str, str]:
        probed = self.probe().enforced if self.runtime.containers else None
        return slurm_enforcement(probed)

    def address(self, node: str) -> str:
        """How replicas on other nodes reach ``node``: Slurm's ``NodeAddr`` (else its
        ``NodeHostname``, else its name)."""
        with self._lock:
            known = self._addresses.get(node)
        if known is None:
            try:
                self._learn(self.slurm_nodes())
            except SlurmError as exc:
                log.warning("cannot read Slurm's nodes: %s", exc)
            with self._lock:
                known = self._addresses.get(node)
        return known or node

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
        self._learn(slurm_nodes)
        return to_nodes(slurm_nodes, self.settings)

    def _learn(self, slurm_nodes: Sequence[SlurmNode]) -> None:
        """Remember each mapped node's GRES type and address."""
        gres: dict[str, str | None] = {}
        addresses: dict[str, str] = {}
        for node in slurm_nodes:
            pool = pool_of(node, self.settings)
            if pool is not None:
                gres[node.name] = gres_type_of(node, self.settings, pool)
                addresses[node.name] = node.address
        with self._lock:
            self._gres = gres
            self._addresses = addresses

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
        existing = self._find(*attempt)
        if existing is not None:
            return [str(existing)] * len(requests)
        try:
            shares = node_shares(requests)
        except UnsupportedRequest as exc:
            raise SlurmError(str(exc)) from exc
        if not self._gres:
            self._learn(self.slurm_nodes())
        if any(r.container is not None for r in requests):
            slurm_dir = self.attempt_dir(*attempt)
            slurm_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            for stale in (STOP_FILE, RESULT_FILE, IMAGE_ERROR_FILE, OOM_FILE):
                (slurm_dir / stale).unlink(missing_ok=True)
            plan = self._containers(requests, slurm_dir)
            text = container_launcher(shares, self.settings.stop_signal, plan)
        else:
            slurm_dir = Path(first.workdir) / "slurm"
            slurm_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            text = launcher_script(shares, self.settings.stop_signal)
        launcher = slurm_dir / "launch.sh"
        launcher.write_text(text)
        script = slurm_dir / "batch.sh"
        uniform = is_uniform(shares, self._gres)
        components = 1 if uniform else len(shares)
        script.write_text(batch_script(str(launcher), components, str(slurm_dir / RESULT_FILE)))
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
        record = Record(
            job_id=first.job_id,
            attempt=first.attempt,
            slurm_id=slurm_id,
            keys=tuple(r.key for r in requests),
            slurm_dir=str(slurm_dir),
            submitted_at=self.clock(),
        )
        with self._lock:
            self.records.put(record)
        log.info("submitted %s/%s as Slurm job %s", first.job_id, first.attempt, slurm_id)
        return [str(slurm_id)] * len(requests)

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        """Where a container attempt's Slurm files, environment files and markers are
        (on the shared file system): under the state directory, out of its tenant's
        reach (the working directory is the tenant's)."""
        name = f"{quote(job_id, safe='').replace('.', '%2E')}-{int(attempt)}"
        return self.attempts_root / name

    def _is_container_dir(self, slurm_dir: str | None) -> bool:
        if slurm_dir is None:
            return False
        return Path(slurm_dir).parent == self.attempts_root

    def _containers(self, requests: Sequence[LaunchRequest], slurm_dir: Path) -> ContainerPlan:
        """How the launcher runs the attempt's containers (see :func:`plan_containers`),
        killing them after half of Slurm's ``KillWait`` when Slurm cancelled the job."""
        try:
            return plan_containers(self.runtime, requests, slurm_dir, self._kill_wait_s)
        except (OSError, ValueError) as exc:  # a process runtime; what no container takes
            raise SlurmError(str(exc)) from exc

    def _kill_wait_s(self) -> float | None:
        """Slurm's ``KillWait`` (read once): how long Slurm lets a cancelled job's
        processes end before it kills them."""
        if self._kill_wait is None:
            try:
                config = parse_config(self.run("scontrol", "show", "config"))
            except SlurmError:
                return None
            self._kill_wait = _seconds(config.get("KillWait"))
        return self._kill_wait

    def _exports(self) -> list[str]:
        return list(dict.fromkeys([*BASE_EXPORTS, *self.settings.export_env]))

    def _find(self, job_id: str, attempt: int) -> int | None:
        """The Slurm job of an attempt: its record, after reading Slurm's listing once
        (a restart between ``sbatch`` and the record adopts the job then)."""
        if not self._observed:
            self._poll()
        with self._lock:
            record = self.records.get(job_id, attempt)
        return None if record is None else record.slurm_id

    def slurm_uid(self) -> int:
        """The user Slurm runs this executor's jobs as (``id -u`` through the prefix)."""
        if self._uid is None:
            if self.settings.command_prefix:
                argv = [*self.settings.command_prefix, "id", "-u"]
                done = subprocess.run(argv, capture_output=True, text=True, check=False)
                self._uid = int(done.stdout.strip() or -1)
            else:
                self._uid = os.getuid()
        return self._uid

    def _poll(self) -> list[SlurmJob]:
        """One ``squeue --json``: this executor's jobs. A job is this executor's when
        its record names its Slurm id, or, unrecorded, when it has Allotment's comment
        and runs as this executor's user (a crash fell between ``sbatch`` and the
        record): it is recorded then. Anything else is left alone."""
        jobs = parse_jobs(json.loads(self.run("squeue", "--json")))
        uid = self.slurm_uid()
        mine: list[SlurmJob] = []
        with self._lock:
            for job in jobs:
                record = self.records.get(job.job_id, job.attempt)
                if record is None and job.user_id == uid:
                    record = Record(
                        job_id=job.job_id,
                        attempt=job.attempt,
                        slurm_id=job.slurm_id,
                        keys=job.keys,
                        slurm_dir=job.output_dir,
                        submitted_at=job.submit_time or self.clock(),
                    )
                    self.records.put(record)
                if record is not None and record.slurm_id == job.slurm_id:
                    mine.append(job)
            self._jobs = {job.slurm_id: job for job in mine}
            self._observed = True
        return mine

    # ------------------------------------------------------------------ observe

    def observe(self) -> dict[ReplicaKey, ReplicaStatus]:
        """Every replica of every attempt this executor submitted (one ``squeue
        --json``). An attempt Slurm no longer lists ended as its record or its batch
        script's result says, else it is ``lost``. Stops past their grace period are
        escalated, and jobs that cannot start are cancelled in Slurm."""
        self._poll()
        now = self.clock()
        out: dict[ReplicaKey, ReplicaStatus] = {}
        to_cancel: list[int] = []
        with self._lock:
            for record in self.records.all():
                job = self._jobs.get(record.slurm_id)
                status = self._status(record, job, now, to_cancel)
                if status.ended and record.final is None:
                    self.records.put(record.ended(status, now))
                elif record.final_seen_at is not None and (
                    now - record.final_seen_at > RECORDS_KEPT_S
                ):
                    self.records.drop(record)
                for key in record.keys:
                    out[key] = status
            for slurm_id in list(self._stops):
                if slurm_id not in self._jobs:
                    del self._stops[slurm_id]
        for slurm_id in to_cancel:
            self._cancel(slurm_id)
        return out

    def _status(
        self, record: Record, job: SlurmJob | None, now: float, to_cancel: list[int]
    ) -> ReplicaStatus:
        containers = self._is_container_dir(record.slurm_dir)
        if job is None:
            if record.final is not None:
                return record.final
            ended = result_status(record.slurm_dir, record.slurm_id)
            if ended is not None and containers:
                ended = with_markers(ended, record.slurm_dir)
            return ended or ReplicaStatus(
                phase=ReplicaPhase.LOST,
                ended_at=now,
                stop_requested=record.slurm_id in self._stops,
                detail=f"Slurm no longer knows job {record.slurm_id}, which left no result",
            )
        stopping = job.slurm_id in self._stops
        status = status_of(
            job,
            now=now,
            stop_requested=stopping,
            pending_since=record.submitted_at,
            timeout=self.settings.pending_timeout,
        )
        if containers and status.ended:
            status = with_markers(status, record.slurm_dir)
        elif containers and status.phase is ReplicaPhase.RUNNING:
            problem = image_error(record.slurm_dir)
            if problem is not None:
                # One node lacks the image: its replicas never start, so the others
                # would wait for them for ever. The attempt ends here.
                to_cancel.append(job.slurm_id)
                return replace(
                    status,
                    phase=ReplicaPhase.EXITED,
                    exit_code=IMAGE_ERROR_EXIT,
                    ended_at=now,
                    image_error=True,
                    detail=problem,
                )
        if status.ended and job.state in PENDING_STATES:
            to_cancel.append(job.slurm_id)  # it cannot start: it must not start later
        elif not status.ended and stopping and now >= self._stops[job.slurm_id]:
            to_cancel.append(job.slurm_id)
            self._stops[job.slurm_id] = float("inf")
        return status

    # ------------------------------------------------------------------ stop

    def stop(self, key: ReplicaKey, grace_s: float) -> None:
        """Send ``stop_signal`` to the attempt's steps (a pending job is cancelled at
        once); the job is cancelled when ``grace_s`` has passed. One stop per attempt:
        the other replicas of a gang share its Slurm job."""
        stop_dir: str | None = None
        with self._lock:
            record = self.records.get(key.job_id, key.attempt)
            if record is None:
                slurm_id = None
            elif record.final is not None or record.slurm_id in self._stops:
                return
            else:
                slurm_id = record.slurm_id
                self._stops[slurm_id] = self.clock() + grace_s
                job = self._jobs.get(slurm_id)
                if self._is_container_dir(record.slurm_dir):
                    stop_dir = record.slurm_dir
        if stop_dir is not None:
            self._write_stop(Path(stop_dir), grace_s)
        if slurm_id is None:
            # A launch that failed on our side (sbatch timed out) may still have
            # reached Slurm: cancel whatever carries the attempt's name.
            self._cancel_named(job_name(key.job_id, key.attempt))
            return
        if job is None or job.state in PENDING_STATES:
            self._cancel(slurm_id)  # not started (or not yet seen): nothing to let finish
            return
        try:
            self.run("scancel", f"--signal={self.settings.stop_signal}", str(slurm_id))
        except SlurmError as exc:  # ended meanwhile, or Slurm unreachable: retried by then
            log.warning("could not signal Slurm job %s: %s", slurm_id, exc)
        if grace_s <= 0:
            self._cancel(slurm_id)

    def _write_stop(self, slurm_dir: Path, grace_s: float) -> None:
        """Tell a container attempt's launchers how long its containers may take to
        stop (they kill them then), before they get the stop signal."""
        path = slurm_dir / STOP_FILE
        try:
            temporary = path.with_suffix(".tmp")
            temporary.write_text(f"{max(0.0, grace_s):.3f}\n")
            temporary.replace(path)
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)

    def _cancel(self, slurm_id: int) -> None:
        try:
            self.run("scancel", str(slurm_id))
        except SlurmError as exc:
            log.warning("could not cancel Slurm job %s: %s", slurm_id, exc)

    def _cancel_named(self, name: str) -> None:
        try:
            self.run("scancel", "--me", f"--name={name}")
        except SlurmError as exc:
            log.warning("could not cancel Slurm jobs named %s: %s", name, exc)


def _seconds(value: str | None) -> float | None:
    """``30 sec`` (as ``scontrol show config`` writes durations) in seconds."""
    if not value:
        return None
    try:
        return float(value.split()[0])
    except ValueError:
        return None
