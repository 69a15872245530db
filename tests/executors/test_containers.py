"""The ``podman run`` command line of a container replica, its environment file, its GPU
devices and its container name (pure functions: nothing is run)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.domain.executor import RuntimeSpec
from allotment.executors.base import Bind, ContainerSpec, LaunchRequest, ReplicaKey
from allotment.executors.containers import (
    LABEL,
    WORKDIR,
    bind_arg,
    container_env,
    container_name,
    env_file_text,
    gpu_device_args,
    podman_run,
)
from allotment.executors.local import LocalExecutor
from allotment.executors.slurm_script import node_shares

IMAGE = "registry.example.com/vision/train:1"
SECRET = "s3cr3t-value-9f2c"
PODMAN_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


def request(tmp_path: Path, **fields: object) -> LaunchRequest:
    container = ContainerSpec(
        image=IMAGE,
        uid=123_456,
        gid=123_456,
        binds=(
            Bind(source="/data/vision/set", target="/data"),
            Bind(source="/scratch/vision/run", target="/out", read_only=False),
        ),
        shm_bytes=2 << 30,
        network=False,
        tenant="vision",
    )
    values: dict[str, object] = {
        "job_id": "j42",
        "attempt": 2,
        "replica": "worker",
        "index": 1,
        "command": ["python", "train.py", "--lr", "0.1"],
        "env": {"TOKEN": SECRET, "EPOCHS": "3"},
        "workdir": tmp_path / "work",
        "devices": (2, 3),
        "cpu_millis": 500,
        "memory_bytes": 8 << 30,
        "container": container,
    }
    values.update(fields)
    return LaunchRequest(**values)  # type: ignore[arg-type]


def options(argv: Sequence[str], name: str) -> list[str]:
    """The values given to option ``name`` (``--x V``), in order."""
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]


def run(tmp_path: Path, runtime: RuntimeSpec | None = None, **fields: object) -> list[str]:
    built = podman_run(
        runtime or RuntimeSpec(kind="podman"),
        request(tmp_path, **fields),
        env_file="/state/r/container.env",
        device_args=["--device", "/dev/nvidia2:/dev/nvidia2"],
        ulimits=(4096, 2048),
    )
    return built.argv


def test_the_command_line(tmp_path: Path) -> None:
    built = podman_run(
        RuntimeSpec(kind="podman"),
        request(tmp_path),
        env_file="/state/r/container.env",
        device_args=["--device", "/dev/nvidia2:/dev/nvidia2"],
        ulimits=(4096, 2048),
    )
    argv = built.argv
    assert argv[:4] == ["podman", "--runtime", "runc", "run"]
    assert options(argv, "--name") == [built.name] and built.name == container_name(
        ReplicaKey("j42", 2, "worker", 1)
    )
    assert options(argv, "--pull") == ["never"]
    assert "--init" in argv
    assert options(argv, "--user") == ["123456:123456"]
    assert options(argv, "--cap-drop") == ["all"]
    assert options(argv, "--security-opt") == ["no-new-privileges"]
    assert options(argv, "--network") == ["none"]
    assert options(argv, "--memory") == [f"{8 << 30}b"]
    assert options(argv, "--memory-swap") == [f"{8 << 30}b"]  # no swap beyond the limit
    assert options(argv, "--cpus") == ["0.5"]
    assert options(argv, "--shm-size") == [f"{2 << 30}b"]
    assert options(argv, "--ulimit") == ["nofile=4096:4096", "nproc=2048:2048"]
    assert options(argv, "--label") == [f"{LABEL}=j42/2/worker-1", "allotment.tenant=vision"]
    assert options(argv, "--mount") == [
        f"type=bind,source={tmp_path / 'work'},destination={WORKDIR}",
        "type=bind,source=/data/vision/set,destination=/data,readonly",
        "type=bind,source=/scratch/vision/run,destination=/out",
    ]
    assert WORKDIR == "/allotment/work"
    assert options(argv, "--workdir") == [WORKDIR]
    assert options(argv, "--device") == ["/dev/nvidia2:/dev/nvidia2"]
    assert options(argv, "--env-file") == ["/state/r/container.env"]
    assert options(argv, "--env") == []
    # The image, then the command, last.
    assert argv[-5:] == [IMAGE, "python", "train.py", "--lr", "0.1"]
    assert argv.index("--env-file") < argv.index(IMAGE)


def test_the_environment_goes_to_the_file_never_the_command_line(tmp_path: Path) -> None:
    built = podman_run(RuntimeSpec(kind="podman"), request(tmp_path), env_file="/e", ulimits=(1, 1))
    assert not any(SECRET in arg for arg in built.argv)
    assert not any("EPOCHS" in arg for arg in built.argv)
    lines = built.env_file.splitlines()
    assert f"TOKEN={SECRET}" in lines and "EPOCHS=3" in lines
    assert "HOME=/allotment/work" in lines
    assert "CUDA_VISIBLE_DEVICES=0,1" in lines  # the container sees only its GPUs, from 0
    assert "ALLOTMENT_HOST_DEVICES=2,3" in lines
    assert lines == sorted(lines)


def test_values_with_line_breaks_are_refused_never_handed_to_podman(tmp_path: Path) -> None:
    # Podman runs as root: a job's value in Podman's own environment (LD_PRELOAD, ...)
    # would change how Podman runs, so what the file cannot carry goes nowhere.
    env = {"PEM": "-----BEGIN-----\nabc\n-----END-----", "CR": "a\rb", "PLAIN": SECRET}
    with pytest.raises(ValueError, match="line breaks cannot go to a container: CR, PEM"):
        podman_run(
            RuntimeSpec(kind="podman"), request(tmp_path, env=env), env_file="/e", ulimits=(1, 1)
        )


def test_the_local_executor_refuses_to_hand_podman_job_values(tmp_path: Path) -> None:
    # Inherited values would be in Podman's own environment (LD_PRELOAD, CONTAINERS_CONF…).
    executor = LocalExecutor(tmp_path / "state", runtime=RuntimeSpec(kind="podman"))
    bad = request(tmp_path, env={"LD_PRELOAD": "/tmp/x.so\n"}, devices=())
    with pytest.raises(OSError, match="LD_PRELOAD"):
        executor.launch(bad)
    assert executor._children == {}
    assert not (executor.replica_dir(bad.key) / "spec.json").exists()


def test_the_network_limits_and_shm_follow_the_request(tmp_path: Path) -> None:
    spec = request(tmp_path).container
    assert spec is not None
    with_network = ContainerSpec(
        image=spec.image, uid=2000, gid=2001, network=True, shm_bytes=64 << 20
    )
    argv = run(tmp_path, container=with_network, cpu_millis=None, memory_bytes=None)
    assert options(argv, "--network") == ["host"]
    assert options(argv, "--user") == ["2000:2001"]
    assert options(argv, "--shm-size") == [f"{64 << 20}b"]
    assert "--memory" not in argv and "--memory-swap" not in argv and "--cpus" not in argv
    assert options(argv, "--mount") == [
        f"type=bind,source={tmp_path / 'work'},destination={WORKDIR}"
    ]
    assert options(run(tmp_path, cpu_millis=2500), "--cpus") == ["2.5"]
    assert options(run(tmp_path, cpu_millis=4000), "--cpus") == ["4"]


def test_a_workdir_override_and_the_podman_program(tmp_path: Path) -> None:
    runtime = RuntimeSpec(kind="podman", podman="/opt/podman/bin/podman", oci_runtime="crun")
    built = podman_run(
        runtime, request(tmp_path), env_file="/e", ulimits=(1, 1), workdir="/elsewhere"
    )
    assert built.argv[:4] == ["/opt/podman/bin/podman", "--runtime", "crun", "run"]
    assert options(built.argv, "--mount")[0] == (
        f"type=bind,source=/elsewhere,destination={WORKDIR}"
    )


def test_a_request_without_a_container_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no container"):
        podman_run(RuntimeSpec(kind="podman"), request(tmp_path, container=None), env_file="/e")


@pytest.mark.parametrize("path", ["/a,b", '/a"b', "/a\nb", "/a\rb", "/a\x00b"])
def test_a_path_the_mount_option_cannot_carry_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match="cannot be mounted"):
        bind_arg(path, "/in", True)
    with pytest.raises(ValueError, match="cannot be mounted"):
        bind_arg("/src", path, True)


def test_env_file_text() -> None:
    assert env_file_text({"B": "2", "A": "x = y", "E": ""}) == "A=x = y\nB=2\nE=\n"
    with pytest.raises(ValueError, match=": N"):
        env_file_text({"B": "2", "N": "1\n2"})


def test_container_env_renumbers_the_devices(tmp_path: Path) -> None:
    env = container_env(request(tmp_path, env={"CUDA_VISIBLE_DEVICES": "7", "HOME": "/h"}))
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["ALLOTMENT_HOST_DEVICES"] == "2,3"
    assert env["HOME"] == "/h"  # the job's own HOME wins
    none = container_env(request(tmp_path, devices=()))
    assert none["CUDA_VISIBLE_DEVICES"] == "" and none["ALLOTMENT_HOST_DEVICES"] == ""


# ---------------------------------------------------------------- GPU devices


def fake_device(path: Path) -> None:
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making device nodes needs root")


def test_gpu_device_nodes_and_the_control_nodes_present(tmp_path: Path) -> None:
    for name in ("nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        fake_device(tmp_path / name)
    runtime = RuntimeSpec(kind="podman", device_dir=str(tmp_path), gpu_devices="device")
    args = gpu_device_args(runtime, (2, 3))
    assert args == [
        "--device",
        f"{tmp_path}/nvidia2:/dev/nvidia2",
        "--device",
        f"{tmp_path}/nvidia3:/dev/nvidia3",
        "--device",
        f"{tmp_path}/nvidiactl:/dev/nvidiactl",
        "--device",
        f"{tmp_path}/nvidia-uvm:/dev/nvidia-uvm",
    ]


def test_control_nodes_are_passed_only_when_present(tmp_path: Path) -> None:
    fake_device(tmp_path / "nvidia0")
    runtime = RuntimeSpec(kind="podman", device_dir=str(tmp_path), gpu_devices="device")
    assert gpu_device_args(runtime, (0,)) == ["--device", f"{tmp_path}/nvidia0:/dev/nvidia0"]
    fake_device(tmp_path / "nvidiactl")
    assert f"{tmp_path}/nvidiactl:/dev/nvidiactl" in gpu_device_args(runtime, (0,))


def test_virtual_gpus_have_no_device_node_to_pass(tmp_path: Path) -> None:
    runtime = RuntimeSpec(kind="podman", device_dir=str(tmp_path), gpu_devices="device")
    assert gpu_device_args(runtime, (0, 1)) == []


def test_a_missing_device_node_among_real_ones_is_an_error(tmp_path: Path) -> None:
    fake_device(tmp_path / "nvidia0")
    runtime = RuntimeSpec(kind="podman", device_dir=str(tmp_path), gpu_devices="device")
    with pytest.raises(ValueError, match="nvidia1 for the replica's GPU"):
        gpu_device_args(runtime, (0, 1))


def test_no_gpus_no_devices(tmp_path: Path) -> None:
    fake_device(tmp_path / "nvidiactl")
    for mode in ("auto", "device", "cdi"):
        runtime = RuntimeSpec(kind="podman", device_dir=str(tmp_path), gpu_devices=mode)  # type: ignore[arg-type]
        assert gpu_device_args(runtime, ()) == []


def test_cdi_names_the_gpus(tmp_path: Path) -> None:
    fake_device(tmp_path / "nvidiactl")
    cdi = RuntimeSpec(kind="podman", device_dir=str(tmp_path), gpu_devices="cdi")
    expected = ["--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"]
    assert gpu_device_args(cdi, (2, 3)) == expected
    auto = RuntimeSpec(kind="podman", device_dir=str(tmp_path), gpu_devices="auto")
    assert gpu_device_args(auto, (2, 3), cdi=True) == expected
    fake_device(tmp_path / "nvidia2")
    assert gpu_device_args(auto, (2,), cdi=False) == [
        "--device",
        f"{tmp_path}/nvidia2:/dev/nvidia2",
        "--device",
        f"{tmp_path}/nvidiactl:/dev/nvidiactl",
    ]


# ---------------------------------------------------------------- names


def test_keys_that_differ_only_in_unsafe_characters_get_different_names() -> None:
    keys = [
        ReplicaKey("job/1", 1, "worker", 0),
        ReplicaKey("job_1", 1, "worker", 0),
        ReplicaKey("job 1", 1, "worker", 0),
        ReplicaKey("job:1", 1, "worker", 0),
        ReplicaKey("job_1", 1, "work/er", 0),
        ReplicaKey("job_1", 1, "work_er", 0),
    ]
    names = [container_name(k) for k in keys]
    assert len(set(names)) == len(keys)
    assert all(PODMAN_NAME.match(n) and n.startswith("allot-") for n in names)
    assert container_name(ReplicaKey("job/1", 1, "worker", 0)) == names[0]  # stable


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=1, max_size=300),
    st.integers(min_value=1, max_value=2**31),
    st.text(min_size=1, max_size=100),
    st.integers(min_value=0, max_value=10_000),
)
def test_names_are_valid_and_bounded(job: str, attempt: int, replica: str, index: int) -> None:
    name = container_name(ReplicaKey(job, attempt, replica, index))
    assert PODMAN_NAME.match(name), name
    assert len(name) <= len("allot-") + 80 + 1 + 8


def test_the_slurm_launcher_groups_container_replicas_by_node(tmp_path: Path) -> None:
    shares = node_shares([request(tmp_path, node="n1"), request(tmp_path, node="n1", index=1)])
    assert [(s.node, len(s.replicas)) for s in shares] == [("n1", 2)]
