"""Containers on the real Slurm test cluster: each replica runs in its image under its
tenant's uid with its mounts, a gang on two nodes meets at ``MASTER_ADDR`` (the
containers share the nodes' network), a missing image fails the attempt as ``image``,
and a cancelled Slurm job leaves no container behind."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from allotment.control.launch import master_port
from allotment.domain.cluster import Cluster
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import ReplicaKey
from allotment.executors.containers import container_name
from allotment.executors.slurm import SlurmExecutor
from allotment.store.jobs import cancel_job
from allotment.store.models import Attempt
from tests.containers.images import PLAIN, PODMAN, TOOLS, build_images, ensure_podman, missing
from tests.slurm.cluster import NODES, SlurmCluster, node_address
from tests.slurm.conftest import MakeLoop, Submit, cluster_yaml, drive, state_of

S = JobState
UID = 54321
MISSING = "localhost/allotment-test/missing:1"


@pytest.fixture(scope="session")
def images() -> None:
    reasons = missing()
    if reasons:
        pytest.skip(f"containers need {', '.join(reasons)}")
    ensure_podman()
    build_images()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A tenant data directory: readable by the tenant's uid, owned by root."""
    directory = tmp_path / "data"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    (directory / "hello.txt").write_text("hello from the data set\n")
    (directory / "hello.txt").chmod(0o644)
    return directory


@pytest.fixture
def cluster(clean: SlurmCluster, images: None, data: Path) -> Cluster:
    """The test cluster with ``runtime: podman``, a tenant allowed the test images and
    its data directory, and a queue that allows the network."""
    text = cluster_yaml(clean.bin_dir, retry="{max_attempts: 1}")
    text = text.replace(
        "  - {name: me, members: [{user: me, role: admin}]}",
        "  - name: me\n"
        "    members: [{user: me, role: admin}]\n"
        "    images: [localhost/allotment-test/*]\n"
        f"    data_scopes: [{data}]\n"
        f"    uid: {UID}",
    )
    text = text.replace("    tenant: me\n", "    tenant: me\n    network: true\n")
    text += (
        "  runtime:\n"
        "    kind: podman\n"
        "    pull: never\n"
        f"    default_image: {PLAIN}\n"
        f"    device_dir: {clean.base / 'dev'}\n"
        "    gpu_devices: device\n"
    )
    loaded = load_cluster_text(text, source="test")
    assert loaded.runtime.containers and loaded.uid_of("me") == UID
    return loaded


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Job ids whose containers are removed after the test, whatever happened."""
    jobs: list[str] = []
    yield jobs
    names = [
        container_name(ReplicaKey(job, attempt, "worker", index))
        for job in jobs
        for attempt in (1, 2)
        for index in range(4)
    ]
    if names:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "0", "--ignore", *names], check=False)


def logs(tmp_path: Path, job_id: str, suffix: str = "out") -> dict[str, str]:
    root = tmp_path / "work" / "me" / job_id / "1" / "logs"
    return {p.name: p.read_text() for p in sorted(root.glob(f"*.{suffix}"))}


def attempt(sessions: sessionmaker[Session], job_id: str) -> Attempt:
    with sessions() as db:
        row = db.get(Attempt, (job_id, 1))
        assert row is not None
        db.expunge(row)
        return row


def present(job_id: str) -> list[str]:
    """The containers of ``job_id`` on this machine, running or not."""
    out = subprocess.run(
        [*PODMAN, "ps", "--all", "--format", "{{.Names}} {{.Labels}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if f"allotment.replica:{job_id}/" in line]


WHO = r"""
cat /etc/os-release | head -n 1
echo "uid=$(id -u) gid=$(id -g)"
cat /data/hello.txt
if touch /data/new 2>/dev/null; then echo data=writable; else echo data=read-only; fi
echo "devices=$CUDA_VISIBLE_DEVICES host=$ALLOTMENT_HOST_DEVICES node=$SLURMD_NODENAME"
echo "nodes=$(ls /dev | grep '^nvidia' | tr '\n' ' ')"
echo "home=$HOME"
echo kept > "$HOME/kept" && echo work=writable
"""


def test_a_replica_runs_in_its_image_as_its_tenant_with_a_read_only_mount(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    data: Path,
    containers: list[str],
) -> None:
    loop = make_loop()
    job = submit(
        ["sh", "-c", WHO],
        gpu=2,
        fields={"image": TOOLS, "mounts": [{"source": str(data), "target": "/data"}]},
    )
    containers.append(job)
    drive(loop, lambda: state_of(sessions, job) is S.SUCCEEDED, "the job succeeds")
    (out,) = logs(tmp_path, job).values()
    lines = out.splitlines()
    node = attempt(sessions, job).allocation[0]["node"]
    assert lines[0] == "ID=allotment-tools"
    assert lines[1] == f"uid={UID} gid={UID}"
    assert lines[2] == "hello from the data set"
    assert lines[3] == "data=read-only"
    assert not (data / "new").exists()
    devices, host, where = (word.split("=", 1)[1] for word in lines[4].split())
    assert devices == "0,1" and where == node  # renumbered inside
    bound = host.split(",")
    assert len(bound) == 2
    assert lines[5] == "nodes=" + "".join(f"nvidia{d} " for d in bound)  # only its GPUs
    assert lines[6:] == ["home=/allotment/work", "work=writable"]
    workdir = tmp_path / "work" / "me" / job / "1"
    assert (workdir / "kept").read_text() == "kept\n"
    assert workdir.stat().st_uid == UID
    executor = loop.executor
    assert isinstance(executor, SlurmExecutor)
    env_files = list(executor.attempt_dir(job, 1).glob("*.env"))
    assert len(env_files) == 1 and env_files[0].stat().st_mode & 0o777 == 0o600
    assert present(job) == []  # removed once it ended
    assert executor.check() == []  # Podman works here, and Slurm is as it must be
    assert executor.enforcement()["identity"].startswith("enforced")


RENDEZVOUS = r"""
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
where = f"{addr}:{port} on {os.environ['SLURMD_NODENAME']}"
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, port))
    server.listen()
    server.settimeout(60)
    met = []
    for _ in range(world - 1):
        peer, _ = server.accept()
        met.append(int(peer.recv(16)))
        peer.sendall(b"0")
    print(f"rank 0 of {world} listened at {where} and met ranks {sorted(met)}")
else:
    deadline = time.time() + 60
    while True:
        try:
            peer = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    peer.sendall(str(rank).encode())
    print(f"rank {rank} of {world} reached rank {int(peer.recv(16))} at {where}")
env = os.environ
print(f"local {env['LOCAL_RANK']}/{env['LOCAL_WORLD_SIZE']} devices "
      f"{env['CUDA_VISIBLE_DEVICES']} host {env['ALLOTMENT_HOST_DEVICES']}")
"""


@pytest.mark.parametrize(("replicas", "gpu"), [(2, 4), (3, 2)], ids=["even", "uneven"])
def test_a_gang_on_two_nodes_meets_at_master_addr_over_the_nodes_network(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    containers: list[str],
    replicas: int,
    gpu: int,
) -> None:
    """Two 4-GPU replicas on two nodes (one Slurm job), or three 2-GPU replicas, two on
    one node and one on the other (a heterogeneous Slurm job)."""
    loop = make_loop()
    job = submit(
        ["python3", "-c", RENDEZVOUS],
        replicas=replicas,
        gpu=gpu,
        fields={"image": TOOLS, "network": True},
    )
    containers.append(job)
    drive(loop, lambda: state_of(sessions, job) is S.SUCCEEDED, "the gang meets", timeout=90)
    placed = [p["node"] for p in attempt(sessions, job).allocation]
    assert len(set(placed)) == 2
    master = node_address(list(NODES).index(placed[0]))
    port = master_port(job, 1)
    assert loop.executor.address(placed[0]) == master  # Slurm's NodeAddr
    out = logs(tmp_path, job)
    assert len(out) == replicas
    lines = {int(name.split("-")[1].split(".")[0]): text.splitlines() for name, text in out.items()}
    others = list(range(1, replicas))
    assert lines[0][0] == (
        f"rank 0 of {replicas} listened at {master}:{port} on {placed[0]} and met ranks {others}"
    )
    for rank in others:
        assert lines[rank][0] == (
            f"rank {rank} of {replicas} reached rank 0 at {master}:{port} on {placed[rank]}"
        )
    inside = ",".join(str(i) for i in range(gpu))
    held: dict[str, set[str]] = {}
    for rank, (_, second) in lines.items():
        local, devices, host = second.split()[1::2]
        mates = placed.count(placed[rank])
        assert local.split("/")[1] == str(mates) and devices == inside
        assert len(host.split(",")) == gpu
        assert not held.setdefault(placed[rank], set()) & set(host.split(","))  # its own GPUs
        held[placed[rank]] |= set(host.split(","))
    assert present(job) == []


def test_a_missing_image_fails_the_attempt_as_class_image(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    containers: list[str],
) -> None:
    loop = make_loop()
    job = submit(["true"], fields={"image": MISSING})
    containers.append(job)
    drive(loop, lambda: state_of(sessions, job) is S.FAILED, "the job fails")
    assert attempt(sessions, job).failure_class == "image"
    (err,) = logs(tmp_path, job, "err").values()
    assert f"allotment: image {MISSING} is not on node " in err


def test_a_job_cancelled_in_slurm_leaves_no_container(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    clean: SlurmCluster,
    containers: list[str],
) -> None:
    """Its process ignores SIGTERM: the launcher kills it before Slurm's KillWait ends."""
    loop = make_loop()
    job = submit(["sh", "-c", "trap '' TERM; echo started; sleep 300"])
    containers.append(job)
    drive(loop, lambda: len(present(job)) == 1, "the container runs")
    (slurm_job,) = [
        j["job_id"]
        for j in json.loads(clean.run("squeue", "--json").stdout)["jobs"]
        if j["name"] == f"allot-{job}-1"
    ]
    clean.run("scancel", str(slurm_job))  # as an administrator would
    deadline = time.monotonic() + 30
    while present(job) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert present(job) == []
    drive(loop, lambda: state_of(sessions, job) is S.FAILED, "the attempt ends")


def test_a_cancel_forwards_the_stop_signal_once_then_removes_the_container(
    make_loop: MakeLoop,
    submit: Submit,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    containers: list[str],
) -> None:
    loop = make_loop()
    script = "trap 'echo got TERM; exit 3' TERM; echo started; sleep 300 & wait"
    job = submit(["sh", "-c", script])
    containers.append(job)
    drive(loop, lambda: "started" in "".join(logs(tmp_path, job).values()), "the job runs")
    with sessions.begin() as db:
        cancel_job(db, job, at=time.time())
    drive(
        loop,
        lambda: attempt(sessions, job).end_time is not None and not present(job),
        "the attempt ends and its container is gone",
    )
    assert state_of(sessions, job) is S.CANCELLED
    # The launcher forwarded SIGTERM (Podman itself forwards nothing: --sig-proxy=false).
    assert logs(tmp_path, job) == {"worker-0.out": "started\ngot TERM\n"}
    executor = loop.executor
    assert isinstance(executor, SlurmExecutor)
    assert (executor.attempt_dir(job, 1) / "stop").read_text() == "2.000\n"  # the loop's grace
