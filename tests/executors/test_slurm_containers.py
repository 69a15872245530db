"""The Slurm launcher of container replicas, without Slurm or Podman: its text, and the
bash run against a stand-in ``podman`` that records what it was asked. The real thing
runs in ``tests/slurm/test_slurm_containers.py``."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from allotment.domain.executor import RuntimeSpec, SlurmSettings
from allotment.domain.lifecycle import FailureClass
from allotment.executors.base import (
    Bind,
    ContainerSpec,
    LaunchRequest,
    ReplicaKey,
    ReplicaPhase,
)
from allotment.executors.containers import NOFILE_CAP, container_name
from allotment.executors.failures import classify
from allotment.executors.slurm import SlurmError, SlurmExecutor
from allotment.executors.slurm_parse import parse_nodes
from allotment.executors.slurm_records import (
    IMAGE_ERROR_FILE,
    OOM_FILE,
    RESULT_FILE,
    STOP_FILE,
    Record,
)
from allotment.executors.slurm_script import (
    ContainerPlan,
    container_launcher,
    container_run,
    env_file_path,
    node_shares,
)

IMAGE = "registry.example/team/train:1"
SECRET = "s3cr3t value"

STUB = r"""#!/bin/bash
# A stand-in for podman: records each call; "run" lasts until "kill --signal KILL".
[ "$1" = --runtime ] && shift 2
printf '%s\n' "$*" >> "$STUB_DIR/calls"
case "$1" in
  image) [ -z "$STUB_NO_IMAGE" ]; exit ;;
  pull) echo "Error: no such registry" >&2; exit 125 ;;
  run)
    if [ "$3" = "$STUB_FAIL_NAME" ]; then echo "Error: cannot create it" >&2; exit 125; fi
    printf '%s\0' "$@" > "$STUB_DIR/run.args"
    printf '%s' "$ALLOTMENT_HOST_DEVICES" > "$STUB_DIR/run.devices"
    echo "container says hello"
    if [ -n "$STUB_RUN_S" ]; then
      echo $$ > "$STUB_DIR/run.pid"; sleep "$STUB_RUN_S" & echo $! > "$STUB_DIR/sleep.pid"; wait
    fi
    exit "${STUB_EXIT:-0}" ;;
  kill)
    if [ "$3" = KILL ]; then
      touch "$STUB_DIR/killed"; kill "$(cat "$STUB_DIR/sleep.pid")" 2>/dev/null
    fi ;;
  inspect)
    if [ "$4" = "$STUB_FAIL_NAME" ]; then exit 125
    elif [ -e "$STUB_DIR/killed" ]; then echo "exited 137 false"
    else echo "exited ${STUB_EXIT:-0} ${STUB_OOM:-false}"; fi ;;
esac
exit 0
"""


def request(tmp: Path, index: int, gpus: int, *, node: str = "a1") -> LaunchRequest:
    logs = tmp / "work" / "logs"
    return LaunchRequest(
        job_id="j-1",
        attempt=1,
        index=index,
        command=["python", "train.py", "--name", "it's $HOME"],
        env={"TOKEN": SECRET},
        workdir=tmp / "work",
        stdout_path=logs / f"worker-{index}.out",
        stderr_path=logs / f"worker-{index}.err",
        devices=tuple(range(gpus)),
        cpu_millis=2000,
        memory_bytes=1 << 30,
        node=node,
        container=ContainerSpec(
            image=IMAGE,
            uid=123456,
            gid=123456,
            binds=(Bind(source="/data/set", target="/data"),),
            network=True,
            tenant="vision",
        ),
    )


def plan_for(
    tmp: Path, requests: list[LaunchRequest], runtime: RuntimeSpec, kill_after: float = 15.0
) -> tuple[str, ContainerPlan]:
    directory = tmp / "attempt"
    directory.mkdir(exist_ok=True)
    runs = {}
    for r in requests:
        run = container_run(runtime, r, str(directory))
        Path(env_file_path(str(directory), r.key)).write_text(run.env_file)
        runs[r.key] = run
    plan = ContainerPlan(
        runtime=runtime, directory=str(directory), runs=runs, kill_after=kill_after
    )
    return container_launcher(node_shares(requests), "TERM", plan), plan


def test_the_launcher_runs_each_replica_with_the_podman_run_of_the_local_executor(
    tmp_path: Path,
) -> None:
    requests = [request(tmp_path, 0, 2), request(tmp_path, 1, 2)]
    runtime = RuntimeSpec(kind="podman", device_dir="/dev/")
    script, plan = plan_for(tmp_path, requests, runtime)
    name = container_name(requests[0].key)
    for needle in (
        f"podman --runtime runc run --name {name} --init --sig-proxy=false",
        "--log-driver passthrough --pull never",
        "--user 123456:123456 --cap-drop all --security-opt no-new-privileges --network host",
        '--ulimit "nofile=${NOFILE}:${NOFILE}" --ulimit "nproc=${NPROC}:${NPROC}"',
        "--mount type=bind,source=/data/set,destination=/data,readonly",
        '"${DEV[@]}"',
        f"--env-file {tmp_path}/attempt/{name}.env --env ALLOTMENT_HOST_DEVICES",
        f"{IMAGE} python train.py --name 'it'\"'\"'s $HOME'",  # quoted as written
        '"$(slice 0 2)"',
        '"$(slice 2 2)"',
        "DEVICE_DIR=/dev\n",
        "image exists",
        'kill --signal "$1"',
        "rm --force --ignore",
        "trap 'on_signal TERM' TERM",
    ):
        assert needle in script, needle
    assert SECRET not in script  # the job's environment is in the 0600 files only
    # A value with a line break fits no environment file, and never goes to Podman's own
    # environment (Podman runs as root): it is refused.
    broken = replace(requests[0], env={"MULTI": "a\nb"})
    with pytest.raises(ValueError, match="line breaks"):
        container_run(runtime, broken, plan.directory)
    env_file = Path(env_file_path(plan.directory, requests[1].key)).read_text()
    assert f"TOKEN={SECRET}\n" in env_file
    assert "CUDA_VISIBLE_DEVICES=0,1\n" in env_file  # the container's own numbering
    assert "ALLOTMENT_HOST_DEVICES" not in env_file  # known on the node only
    result = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    directory = tmp_path / "stub"
    directory.mkdir()
    podman = directory / "podman"
    podman.write_text(STUB)
    podman.chmod(0o755)
    return directory


Launch = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def launch(stub: Path) -> Iterator[Launch]:
    started: list[subprocess.Popen[str]] = []

    def start(script: str, where: Path, **env: str) -> subprocess.Popen[str]:
        path = where / "launch.sh"
        path.write_text(script)
        process = subprocess.Popen(
            ["bash", str(path)],
            env={
                "PATH": os.environ["PATH"],
                "STUB_DIR": str(stub),
                "SLURMD_NODENAME": "a1",
                "SLURM_JOB_ID": "77",
                **env,
            },
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def stub_runtime(stub: Path, tmp: Path, **more: Any) -> RuntimeSpec:
    devices = tmp / "dev"
    devices.mkdir(exist_ok=True)
    (devices / "nvidiactl").touch()
    return RuntimeSpec(kind="podman", podman=str(stub / "podman"), device_dir=str(devices), **more)


def calls(stub: Path) -> list[str]:
    path = stub / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_on_its_node_the_launcher_passes_the_gpus_slurm_bound_and_the_nodes_limits(
    tmp_path: Path, stub: Path, launch: Launch
) -> None:
    runtime = stub_runtime(stub, tmp_path, gpu_devices="device")
    req = request(tmp_path, 0, 2)
    req.stderr_path.parent.mkdir(parents=True)  # type: ignore[union-attr]
    script, _ = plan_for(tmp_path, [req], runtime)
    done = launch(script, tmp_path, SLURM_STEP_GPUS="2,3", CUDA_VISIBLE_DEVICES="2,3")
    assert done.wait(timeout=30) == 0, done.stdout.read() if done.stdout else ""
    args = (stub / "run.args").read_text().split("\0")[:-1]
    devices = tmp_path / "dev"
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--device"]
    assert pairs == [
        f"{devices}/nvidia2:/dev/nvidia2",
        f"{devices}/nvidia3:/dev/nvidia3",
        f"{devices}/nvidiactl:/dev/nvidiactl",
    ]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = NOFILE_CAP if hard == resource.RLIM_INFINITY else min(hard, NOFILE_CAP)
    assert f"nofile={nofile}:{nofile}" in args
    assert (stub / "run.devices").read_text() == "2,3"  # ALLOTMENT_HOST_DEVICES
    assert req.stdout_path is not None and req.stdout_path.read_text() == "container says hello\n"
    name = container_name(req.key)
    seen = calls(stub)
    assert seen[0] == f"image exists {IMAGE}"
    assert seen[-1] == f"rm --force --ignore {name}"  # removed once it ended
    assert not (tmp_path / "attempt" / IMAGE_ERROR_FILE).exists()


def test_cdi_names_the_gpus_instead_of_their_device_nodes(
    tmp_path: Path, stub: Path, launch: Launch
) -> None:
    runtime = stub_runtime(stub, tmp_path, gpu_devices="cdi")
    req = request(tmp_path, 0, 1)
    req.stderr_path.parent.mkdir(parents=True)  # type: ignore[union-attr]
    script, _ = plan_for(tmp_path, [req], runtime)
    assert launch(script, tmp_path, SLURM_STEP_GPUS="5").wait(timeout=30) == 0
    args = (stub / "run.args").read_text().split("\0")
    assert [args[i + 1] for i, a in enumerate(args) if a == "--device"] == ["nvidia.com/gpu=5"]


@pytest.mark.parametrize("pull", ["never", "missing"])
def test_a_missing_image_ends_the_attempt_with_an_image_error(
    tmp_path: Path, stub: Path, launch: Launch, pull: str
) -> None:
    runtime = stub_runtime(stub, tmp_path, pull=pull)
    req = request(tmp_path, 0, 0)
    req.stderr_path.parent.mkdir(parents=True)  # type: ignore[union-attr]
    script, plan = plan_for(tmp_path, [req], runtime)
    assert launch(script, tmp_path, STUB_NO_IMAGE="1").wait(timeout=30) == 125
    assert not (stub / "run.args").exists()  # nothing ran
    said = (Path(plan.directory) / IMAGE_ERROR_FILE).read_text()
    expected = "not on node a1" if pull == "never" else "could not be pulled on a1"
    assert expected in said and IMAGE in said
    assert req.stderr_path is not None and expected in req.stderr_path.read_text()
    assert ("pull --quiet " + IMAGE in calls(stub)) is (pull == "missing")


def test_a_stop_is_forwarded_then_the_container_is_killed_and_removed(
    tmp_path: Path, stub: Path, launch: Launch
) -> None:
    runtime = stub_runtime(stub, tmp_path)
    req = request(tmp_path, 0, 0)
    req.stderr_path.parent.mkdir(parents=True)  # type: ignore[union-attr]
    script, plan = plan_for(tmp_path, [req], runtime, kill_after=30)
    (Path(plan.directory) / STOP_FILE).unlink(missing_ok=True)
    running = launch(script, tmp_path, STUB_RUN_S="60")
    deadline = time.monotonic() + 20
    while not (stub / "run.pid").exists():
        assert time.monotonic() < deadline, "the container never started"
        time.sleep(0.05)
    time.sleep(0.2)
    (Path(plan.directory) / STOP_FILE).write_text("1.000\n")  # as SlurmExecutor.stop writes
    start = time.monotonic()
    running.send_signal(signal.SIGTERM)  # to the launcher only: it forwards
    assert running.wait(timeout=20) == 137  # it ignored SIGTERM, so it was killed
    took = time.monotonic() - start
    name = container_name(req.key)
    seen = calls(stub)
    assert f"kill --signal TERM {name}" in seen
    assert seen.index(f"kill --signal TERM {name}") < seen.index(f"kill --signal KILL {name}")
    assert seen[-1] == f"rm --force --ignore {name}"
    assert 0.9 <= took < 10  # after the grace the executor wrote, not Slurm's own


def test_a_container_that_cannot_start_is_said_at_once_though_its_neighbour_runs(
    tmp_path: Path, stub: Path, launch: Launch
) -> None:
    runtime = stub_runtime(stub, tmp_path)
    requests = [request(tmp_path, 0, 0), request(tmp_path, 1, 0)]
    requests[0].stderr_path.parent.mkdir(parents=True)  # type: ignore[union-attr]
    script, plan = plan_for(tmp_path, requests, runtime)
    failing = container_name(requests[1].key)
    running = launch(script, tmp_path, STUB_RUN_S="60", STUB_FAIL_NAME=failing)
    marker = Path(plan.directory) / IMAGE_ERROR_FILE
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the failed start was not said"
        time.sleep(0.1)
    assert running.poll() is None  # replica 0 still runs: the server cancels the attempt
    assert "could not be created or started on a1" in marker.read_text()
    (Path(plan.directory) / STOP_FILE).write_text("0\n")
    running.send_signal(signal.SIGTERM)
    assert running.wait(timeout=20) == 125  # the first failure is the launcher's
    assert f"kill --signal KILL {container_name(requests[0].key)} {failing}" in calls(stub)
    assert f"rm --force --ignore {failing}" in calls(stub)


def test_a_launcher_stopped_before_it_started_starts_nothing(
    tmp_path: Path, stub: Path, launch: Launch
) -> None:
    runtime = stub_runtime(stub, tmp_path)
    req = request(tmp_path, 0, 0)
    req.stderr_path.parent.mkdir(parents=True)  # type: ignore[union-attr]
    script, plan = plan_for(tmp_path, [req], runtime)
    (Path(plan.directory) / STOP_FILE).write_text("5.000\n")
    assert launch(script, tmp_path).wait(timeout=30) == 143
    assert not (stub / "run.args").exists()


# ------------------------------------------------------------------ the executor's side

SETTINGS = SlurmSettings.model_validate({"partition": "gpu", "pools": {"a": {"gres_type": "a"}}})
KEY = ReplicaKey("j-1", 1, "worker", 0)


class Canned(SlurmExecutor):
    """Answers ``squeue --json`` with ``jobs``; records every other command."""

    def __init__(
        self, state: Path, jobs: list[dict[str, Any]], runtime: RuntimeSpec | None = None
    ) -> None:
        runtime = runtime or RuntimeSpec(kind="podman")
        super().__init__(SETTINGS, state, runtime=runtime, clock=lambda: 1000.0)
        self.jobs = jobs
        self.ran: list[tuple[str, ...]] = []

    def run(self, command: str, *args: str, stdin: str | None = None) -> str:
        if command == "squeue":
            return json.dumps({"jobs": self.jobs})
        if command == "scontrol" and args[:2] == ("show", "node"):
            return (
                "NodeName=a1 NodeAddr=10.0.0.1 NodeHostname=a1.cluster Gres=gpu:a:4 "
                "State=IDLE Partitions=gpu\n"
                "NodeName=a2 NodeHostname=a2.cluster Gres=gpu:a:4 State=IDLE Partitions=gpu\n"
            )
        self.ran.append((command, *args))
        return ""


def slurm_job(state: str, **more: Any) -> dict[str, Any]:
    return {
        "job_id": 7,
        "name": "allot-j-1-1",
        "comment": "allotment job=j-1 attempt=1 replicas=worker-0",
        "job_state": state,
        "state_reason": "None",
        "start_time": 900,
        "end_time": 950,
        "submit_time": 890,
        "exit_code": 0,
        "user_id": os.getuid(),
        **more,
    }


def recorded(executor: SlurmExecutor) -> Path:
    directory = executor.attempt_dir("j-1", 1)
    directory.mkdir(parents=True)
    executor.records.put(
        Record(
            job_id="j-1",
            attempt=1,
            slurm_id=7,
            keys=(KEY,),
            slurm_dir=str(directory),
            submitted_at=880.0,
        )
    )
    return directory


def test_an_image_error_on_one_node_ends_a_running_attempt_as_class_image(
    tmp_path: Path,
) -> None:
    executor = Canned(tmp_path / "state", [slurm_job("RUNNING")])
    directory = recorded(executor)
    assert executor.observe()[KEY].phase is ReplicaPhase.RUNNING
    (directory / IMAGE_ERROR_FILE).write_text("image x is not on node a2\n")
    status = executor.observe()[KEY]
    assert status.ended and status.image_error and "not on node a2" in status.detail
    assert classify(status) is FailureClass.IMAGE
    assert ("scancel", "7") in executor.ran  # the replicas that did start are ended


def test_what_a_launcher_left_outlives_slurm_forgetting_the_job(tmp_path: Path) -> None:
    executor = Canned(tmp_path / "state", [])
    directory = recorded(executor)
    (directory / RESULT_FILE).write_text("137 900 960\n")
    (directory / OOM_FILE).write_text("allot-j-1-1-worker-0\n")
    status = executor.observe()[KEY]
    assert (status.phase, status.exit_code, status.oom) == (ReplicaPhase.EXITED, 137, True)
    assert classify(status) is FailureClass.OOM


def test_a_stop_tells_the_launchers_the_grace_before_signalling(tmp_path: Path) -> None:
    executor = Canned(tmp_path / "state", [slurm_job("RUNNING")])
    directory = recorded(executor)
    executor.observe()
    executor.stop(KEY, 7.5)
    assert (directory / STOP_FILE).read_text() == "7.500\n"
    assert executor.ran[-1] == ("scancel", "--signal=TERM", "7")


def test_other_nodes_reach_a_node_at_its_slurm_address(tmp_path: Path) -> None:
    executor = Canned(tmp_path / "state", [])
    assert executor.address("a1") == "10.0.0.1"  # NodeAddr
    assert executor.address("a2") == "a2.cluster"  # else NodeHostname
    assert executor.address("elsewhere") == "elsewhere"
    (node,) = parse_nodes("NodeName=n9 NodeAddr=(null) State=IDLE")
    assert node.address == "n9"


def test_a_process_runtime_refuses_containers_and_says_what_it_enforces(
    tmp_path: Path,
) -> None:
    plain = Canned(tmp_path / "state", [], runtime=RuntimeSpec())
    with pytest.raises(SlurmError, match="plain processes"):
        plain.launch_all([request(tmp_path, 0, 0)])
    assert plain.ran == []  # nothing submitted
    assert "NOT enforced" in plain.enforcement()["identity"]
    assert "Podman on each node" in Canned(tmp_path / "c", []).enforcement()["memory"]
