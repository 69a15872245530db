"""Containers on the local executor, tried as a new user would: ``allot up`` as a real
process with ``executor.runtime.kind: podman``, real Podman (runc) containers of images
built here, two tenants with their own data, fake GPU device nodes.

What it proves: a job runs in its allowed image under its tenant's uid and sees only its
GPUs; a disallowed image is refused at submit (422, allow-list named, audited); a
missing image fails with class ``image``; one tenant cannot read another's data by any
path; read-only mounts stay read-only; memory and CPU requests are container limits
(an over-allocation is classed ``oom``); no network unless asked and allowed; a
two-replica gang completes a rendezvous; a cancelled job leaves no container behind.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from allotment.client import ClientError
from allotment.domain.executor import RuntimeSpec
from allotment.domain.loading import load_cluster_text
from allotment.executors.base import ContainerSpec, LaunchRequest, ReplicaPhase
from allotment.executors.containers import container_name
from allotment.executors.local import LocalExecutor
from allotment.executors.supervisor import read_json
from tests.containers.images import PLAIN, PODMAN, TOOLS, build_images, ensure_podman, missing
from tests.server.conftest import Up
from tests.server.test_acceptance import allot

pytestmark = pytest.mark.skipif(bool(missing()), reason=f"containers need {missing()}")

CLUSTER = """
pools: [{{name: local}}]
nodes: [{{name: box, pool: local, capacity: {{gpu: 2, cpu: 4, memory: 8Gi}}}}]
tenants:
  - name: alpha
    data_scopes: ["{data}/alpha", {{path: "{data}/alpha-scratch", writable: true}}]
    images: [localhost/allotment-test/tools]
  - name: beta
    data_scopes: ["{data}/beta"]
    images: ["{plain}"]
queues:
  - name: root
    children:
      - {{name: alpha-q, tenant: alpha, network: true, quota: {{local: {{gpu: 2, cpu: 4}}}}}}
      - {{name: beta-q, tenant: beta, quota: {{local: {{gpu: 0, cpu: 0}}}}}}
executor:
  runtime: {{kind: podman, pull: never, device_dir: "{devices}"}}
"""

SECRET = "beta-secret-4242"


def _char_device(path: Path) -> None:
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, Path]]:
    ensure_podman()
    build_images()
    root = tmp_path_factory.mktemp("containers")
    data = root / "data"
    for name in ("alpha", "alpha-scratch", "beta"):
        (data / name).mkdir(parents=True)
    (data / "alpha" / "mine.txt").write_text("alpha-data")
    (data / "beta" / "secret.txt").write_text(SECRET)
    (data / "beta").chmod(0o755)
    # A link inside alpha's scope that leads to beta's data, on the host.
    (data / "alpha" / "to-beta").symlink_to(data / "beta" / "secret.txt")
    devices = root / "dev"
    devices.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        _char_device(devices / name)
    cluster = root / "cluster.yaml"
    cluster.write_text(CLUSTER.format(data=data, plain=PLAIN, devices=devices))
    # Data owners grant a tenant's uid write access themselves, as a platform team would.
    alpha_uid = load_cluster_text(cluster.read_text()).uid_of("alpha")
    os.chown(data / "alpha-scratch", alpha_uid, alpha_uid)
    up = Up(root=root)
    up.start("-f", str(cluster))
    try:
        yield up, data
    finally:
        up.close()
        _remove_containers()


def _containers() -> list[str]:
    out = subprocess.run(
        [*PODMAN, "ps", "--all", "--filter", "label=allotment.replica", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def _remove_containers() -> None:
    names = _containers()
    if names:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "0", *names], capture_output=True)


def job(
    command: list[str],
    *,
    queue: str = "alpha-q",
    image: str | None = TOOLS,
    count: int = 1,
    gpu: int = 0,
    cpu: str = "1",
    memory: str = "512Mi",
    **extra: Any,
) -> str:
    spec: dict[str, Any] = {
        "name": "c",
        "queue": queue,
        "replicas": [
            {"count": count, "resources": {"gpu": gpu, "cpu": cpu, "memory": memory}},
        ],
        "command": command,
        **extra,
    }
    if image is not None:
        spec["image"] = image
    return json.dumps(spec)


def submit(up: Up, spec: str) -> str:
    with up.client() as client:
        return str(client.submit(spec)["id"])


def finish(up: Up, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with up.client() as client:
            job = client.get_job(job_id)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"{job_id} did not end: {job}")


def logs(up: Up, job_id: str, replica: str | None = None, stream: str = "out") -> str:
    with up.client() as client:
        return str(client.logs(job_id, replica=replica, stream=stream)["data"])


def python(code: str) -> list[str]:
    return ["python3", "-c", code]


def test_a_job_runs_in_its_image_as_its_tenant_with_only_its_gpu(
    deployment: tuple[Up, Path],
) -> None:
    up, _ = deployment
    uid = load_cluster_text((up.root / "cluster.yaml").read_text()).uid_of("alpha")
    script = (
        "import os; print(open('/etc/os-release').read().splitlines()[0]); "
        "print('uid', os.getuid(), os.getgid()); "
        "print('gpus', sorted(d for d in os.listdir('/dev') if d.startswith('nvidia'))); "
        "print('cvd', os.environ['CUDA_VISIBLE_DEVICES']); print('cwd', os.getcwd()); "
        "open('made-here.txt', 'w').write('x'); "
        "print('server env', 'XDG_CONFIG_HOME' in os.environ)"
    )
    job_id = submit(up, job(python(script), gpu=1))
    done = finish(up, job_id)
    out = logs(up, job_id)
    assert done["state"] == "succeeded", (done, out, logs(up, job_id, stream="err"))
    lines = out.splitlines()
    assert lines[0] == "ID=allotment-tools"
    assert lines[1] == f"uid {uid} {uid}"
    gpus = json.loads(lines[2].removeprefix("gpus ").replace("'", '"'))
    assert len([g for g in gpus if g != "nvidiactl"]) == 1 and "nvidiactl" in gpus
    assert lines[3] == "cvd 0"
    assert lines[4] == "cwd /allotment/work"
    assert lines[5] == "server env False"
    made = next((up.data_dir / "work").glob(f"alpha/{job_id}/1/made-here.txt"))
    assert made.stat().st_uid == uid
    assert made.parent.stat().st_uid == uid and stat.S_IMODE(made.parent.stat().st_mode) == 0o700


def test_allot_run_takes_an_image_mounts_and_the_network(deployment: tuple[Up, Path]) -> None:
    up, data = deployment
    command = ["sh", "-c", "cat /etc/os-release /in/mine.txt; ls /in"]
    job_id = allot(
        up, "run", "-q", "alpha-q", "--gpus", "0", "--image", TOOLS,
        "--mount", f"{data / 'alpha'}:/in", "--network", "--", *command,
    ).stdout.strip()  # fmt: skip
    done = finish(up, job_id)
    assert done["state"] == "succeeded"
    assert done["spec"]["mounts"] == [
        {"source": str(data / "alpha"), "target": "/in", "read_only": True}
    ]
    assert done["spec"]["network"] is True
    assert "ID=allotment-tools" in logs(up, job_id) and "alpha-data" in logs(up, job_id)
    bad = allot(up, "run", "--mount", "nocolon", "--", "true", check=False)
    assert bad.returncode != 0 and "SOURCE:TARGET" in bad.stderr


def test_a_disallowed_image_is_refused_at_submit_with_the_allow_list(
    deployment: tuple[Up, Path],
) -> None:
    up, _ = deployment
    with up.client() as client:
        with pytest.raises(ClientError) as caught:
            client.submit(job(["true"], image="registry.example/nlp/evil:latest"))
        error = caught.value
        assert error.status == 422 and error.code == "image_not_allowed"
        assert "localhost/allotment-test/tools" in error.message
        assert error.fields["allowed"] == ["localhost/allotment-test/tools"]
        records = client.audit(action="job.submit")["records"]
        assert any(
            r["result"] == "denied" and r["detail"]["code"] == "image_not_allowed" for r in records
        )
        # Another tenant's image is not allowed either.
        with pytest.raises(ClientError) as other:
            client.submit(job(["true"], image=PLAIN))
        assert other.value.code == "image_not_allowed"


def test_a_missing_image_fails_with_class_image(deployment: tuple[Up, Path]) -> None:
    up, _ = deployment
    job_id = submit(up, job(["true"], image="localhost/allotment-test/tools:does-not-exist"))
    done = finish(up, job_id)
    assert done["state"] == "failed" and done["failure_class"] == "image"
    assert "is not on this node" in logs(up, job_id, stream="err")


def test_a_program_exiting_125_is_its_own_failure_not_the_images(
    deployment: tuple[Up, Path],
) -> None:
    up, _ = deployment
    done = finish(up, submit(up, job(["sh", "-c", "exit 125"])))
    assert done["state"] == "failed" and done["failure_class"] == "user_code"


def test_a_tenant_cannot_read_another_tenants_data_by_any_path(
    deployment: tuple[Up, Path],
) -> None:
    up, data = deployment
    beta = data / "beta" / "secret.txt"
    beta_job = submit(
        up, job(["sh", "-c", f"echo {SECRET} > leak.txt"], queue="beta-q", image=PLAIN)
    )
    assert finish(up, beta_job)["state"] == "succeeded"
    beta_work = next((up.data_dir / "work").glob(f"beta/{beta_job}/1"))
    attempts = [
        str(beta),
        f"/data/../../{beta}",
        "/data/to-beta",
        f"/proc/1/root{beta}",
        f"/proc/self/root{beta}",
        f"{beta_work}/leak.txt",
        f"/allotment/work/../../{beta_work}/leak.txt",
    ]
    script = (
        "import sys\n"
        f"paths = {attempts!r}\n"
        "for p in paths:\n"
        "    try:\n"
        "        text = open(p).read()\n"
        "    except OSError as exc:\n"
        "        print('refused', p, type(exc).__name__)\n"
        "    else:\n"
        "        print('READ', p, text)\n"
        "print('own', open('/data/mine.txt').read())\n"
        "try:\n"
        "    open('/data/new.txt', 'w')\n"
        "except OSError as exc:\n"
        "    print('read-only', exc.errno)\n"
        "open('/scratch/out.txt', 'w').write('written')\n"
    )
    spec = job(
        python(script),
        mounts=[
            {"source": str(data / "alpha"), "target": "/data"},
            {"source": str(data / "alpha-scratch"), "target": "/scratch", "read_only": False},
        ],
    )
    job_id = submit(up, spec)
    done = finish(up, job_id)
    out = logs(up, job_id)
    assert done["state"] == "succeeded", (out, logs(up, job_id, stream="err"))
    assert SECRET not in out
    assert out.count("refused") == len(attempts)
    assert "own alpha-data" in out
    assert "read-only 30" in out  # EROFS
    assert (data / "alpha-scratch" / "out.txt").read_text() == "written"
    # Mounting the link, or beta's directory, is refused at submit.
    with up.client() as client:
        for source in (str(data / "alpha" / "to-beta"), str(data / "alpha" / ".." / "beta")):
            with pytest.raises(ClientError) as caught:
                client.submit(job(["true"], mounts=[{"source": source, "target": "/x"}]))
            assert caught.value.code == "mount_not_allowed"
        with pytest.raises(ClientError) as caught:
            client.submit(
                job(
                    ["true"],
                    mounts=[{"source": str(data / "alpha"), "target": "/x", "read_only": False}],
                )
            )
        assert caught.value.code == "mount_not_allowed" and "read-only" in caught.value.message


def test_memory_over_the_request_is_killed_and_classed_oom(deployment: tuple[Up, Path]) -> None:
    up, _ = deployment
    job_id = submit(
        up,
        job(python("x = bytearray(1 << 30); print('survived', len(x))"), memory="256Mi"),
    )
    done = finish(up, job_id)
    assert done["state"] == "failed" and done["failure_class"] == "oom", done
    assert "survived" not in logs(up, job_id)


def test_a_cpu_request_is_a_cpu_limit(deployment: tuple[Up, Path]) -> None:
    up, _ = deployment
    script = (
        "import multiprocessing as mp, os, time\n"
        "def spin():\n"
        "    end = time.time() + 2.0\n"
        "    while time.time() < end: pass\n"
        "for path in ('/sys/fs/cgroup/cpu/cpu.cfs_quota_us', '/sys/fs/cgroup/cpu.max'):\n"
        "    if os.path.exists(path): print('quota', open(path).read().split()[0])\n"
        "ps = [mp.Process(target=spin) for _ in range(2)]\n"
        "[p.start() for p in ps]; [p.join() for p in ps]\n"
        "t = os.times(); print('cpu', t.children_user + t.children_system)\n"
    )
    job_id = submit(up, job(python(script), cpu="500m"))
    done = finish(up, job_id)
    out = logs(up, job_id)
    assert done["state"] == "succeeded", (out, logs(up, job_id, stream="err"))
    values = dict(line.split(" ", 1) for line in out.splitlines())
    assert values["quota"].strip() == "50000"  # half of the 100000 µs period
    # Two busy processes for 2 s of wall time get at most half a core between them.
    assert float(values["cpu"]) <= 0.5 * 2.0 + 0.35


def test_no_network_unless_asked_and_allowed(deployment: tuple[Up, Path]) -> None:
    up, _ = deployment
    script = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {up.port}), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('no network', type(exc).__name__)\n"
    )
    closed = submit(up, job(python(script)))
    opened = submit(up, job(python(script), network=True))
    assert finish(up, closed)["state"] == "succeeded"
    assert finish(up, opened)["state"] == "succeeded"
    assert logs(up, closed).startswith("no network")
    assert logs(up, opened).strip() == "connected"
    with up.client() as client, pytest.raises(ClientError) as caught:
        client.submit(job(["true"], queue="beta-q", image=PLAIN, network=True))
    assert caught.value.code == "invalid_config" and "does not allow the network" in (
        caught.value.message
    )


RENDEZVOUS = """
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print("env", rank, world, os.environ["LOCAL_RANK"], os.environ["NODE_RANK"],
      os.environ["ALLOTMENT_PEERS"], flush=True)
if rank == 0:
    server = socket.create_server((addr, port))
    seen = [0]
    peers = []
    for _ in range(world - 1):
        conn, _ = server.accept()
        seen.append(int(conn.recv(16).decode()))
        peers.append(conn)
    for conn in peers:
        conn.sendall(("ok " + ",".join(map(str, sorted(seen)))).encode())
        conn.close()
    print("rendezvous", rank, "ok", ",".join(map(str, sorted(seen))))
else:
    deadline = time.time() + 30
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(str(rank).encode())
    print("rendezvous", rank, conn.recv(64).decode())
"""


def test_a_two_replica_gang_completes_a_rendezvous(deployment: tuple[Up, Path]) -> None:
    up, _ = deployment
    job_id = submit(up, job(python(RENDEZVOUS), count=2, gpu=1, network=True))
    done = finish(up, job_id)
    outs = [logs(up, job_id, replica=f"worker-{i}") for i in range(2)]
    assert done["state"] == "succeeded", (outs, logs(up, job_id, stream="err"))
    assert outs[0].splitlines()[0] == "env 0 2 0 0 127.0.0.1,127.0.0.1"
    assert outs[1].splitlines()[0] == "env 1 2 1 0 127.0.0.1,127.0.0.1"
    assert outs[0].splitlines()[1] == "rendezvous 0 ok 0,1"
    assert outs[1].splitlines()[1] == "rendezvous 1 ok 0,1"


def test_a_cancelled_job_leaves_no_container(deployment: tuple[Up, Path]) -> None:
    up, _ = deployment
    job_id = submit(up, job(["sleep", "300"]))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with up.client() as client:
            if client.get_job(job_id)["state"] == "running" and _containers():
                break
        time.sleep(0.2)
    else:
        raise AssertionError("the job did not start")
    with up.client() as client:
        client.cancel(job_id)
    deadline = time.monotonic() + 30
    while _containers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _containers() == []


def _executor(tmp_path: Path) -> LocalExecutor:
    ensure_podman()
    build_images()
    return LocalExecutor(tmp_path / "executor", runtime=RuntimeSpec(kind="podman", pull="never"))


def _request(tmp_path: Path, command: list[str]) -> LaunchRequest:
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    return LaunchRequest(
        job_id="j-direct",
        attempt=1,
        command=command,
        workdir=workdir,
        memory_bytes=512 << 20,
        container=ContainerSpec(image=TOOLS, uid=150_000, gid=150_000, tenant="t"),
    )


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_usage_counts_the_containers_processes(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    request = _request(tmp_path, python("x = b'1' * (200 << 20); import time; time.sleep(60)"))
    executor.launch(request)
    try:

        def big() -> bool:
            usage = executor.usage().get(request.key)
            return usage is not None and (usage.memory_bytes or 0) >= 200 << 20

        _wait(big, "the container's memory to show in usage")
    finally:
        executor.stop(request.key, 0.5)
        _wait(lambda: executor.observe()[request.key].ended, "the replica to end")
    assert request.key not in executor.usage()


def test_a_lost_supervisors_container_is_removed_by_stop(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    request = _request(tmp_path, ["sleep", "300"])
    executor.launch(request)
    state = executor.replica_dir(request.key) / "state.json"
    _wait(lambda: "container_pid" in (read_json(state) or {}), "the container to run")
    supervisor = (read_json(state) or {})["supervisor_pid"]
    os.kill(supervisor, signal.SIGKILL)
    _wait(lambda: executor.observe()[request.key].phase is ReplicaPhase.LOST, "LOST")
    assert container_name(request.key) in _containers()
    executor.stop(request.key, 1.0)
    assert container_name(request.key) not in _containers()
