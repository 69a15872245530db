"""Reading Slurm's output without a cluster: node health and pools, configuration
checks, job states and exit codes, and what is submitted for a placement."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allotment.domain.executor import ExecutorSpec, SlurmSettings
from allotment.domain.lifecycle import FailureClass
from allotment.executors.base import LaunchRequest, ReplicaKey, ReplicaPhase, ReplicaStatus
from allotment.executors.failures import classify
from allotment.executors.slurm_parse import (
    SlurmJob,
    comment_for,
    config_problems,
    parse_jobs,
    parse_nodes,
    status_of,
    to_nodes,
)
from allotment.executors.slurm_script import (
    UnsupportedRequest,
    is_uniform,
    launcher_script,
    node_shares,
    sbatch_argv,
)

NODES = """\
NodeName=a1 Arch=x86_64 CPUAlloc=0 CPUEfctv=64 CPUTot=64 AvailableFeatures=ib,nvlink ActiveFeatures=ib Gres=gpu:a100:8(S:0-1) NodeAddr=a1 OS=Linux 6.1.0 #1 SMP RealMemory=512000 State=IDLE Partitions=gpu,all
NodeName=a2 CPUTot=64 AvailableFeatures=(null) Gres=gpu:a100:8 RealMemory=512000 State=MIXED+DRAIN Partitions=gpu
NodeName=a3 CPUTot=64 Gres=gpu:a100:8 RealMemory=512000 State=ALLOCATED* Partitions=gpu
NodeName=h1 CPUTot=32 Gres=gpu:h100:4,shard:16 RealMemory=256000 State=IDLE Partitions=gpu
NodeName=c1 CPUTot=16 Gres=(null) RealMemory=64000 State=IDLE Partitions=cpu
"""  # noqa: E501 (as scontrol prints them)

SETTINGS = SlurmSettings.model_validate(
    {
        "partition": "gpu",
        "pools": {"a100": {"gres_type": "a100"}, "h100": {"gres_type": "h100"}},
    }
)


def test_nodes_map_to_pools_by_gres_type_with_their_health() -> None:
    nodes = to_nodes(parse_nodes(NODES), SETTINGS)
    assert sorted(nodes) == ["a1", "a2", "a3", "h1"]  # c1 is nobody's
    a1 = nodes["a1"]
    assert (a1.pool, a1.gpu_count, a1.healthy) == ("a100", 8, True)
    assert a1.capacity["cpu"] == 64_000  # milli-CPUs
    assert [d.model for d in a1.devices] == ["a100"] * 8
    assert not nodes["a2"].healthy  # draining
    assert not nodes["a3"].healthy  # not responding
    assert nodes["h1"].gpu_count == 4  # shards are not GPUs


def test_a_feature_or_partition_rule_picks_nodes_too() -> None:
    settings = SlurmSettings.model_validate(
        {"partition": "gpu", "pools": {"fast": {"feature": "nvlink"}, "cpu": {"partition": "cpu"}}}
    )
    nodes = to_nodes(parse_nodes(NODES), settings)
    assert {n: v.pool for n, v in nodes.items()} == {"a1": "fast", "c1": "cpu"}
    assert nodes["c1"].gpu_count == 0


def test_the_executor_section_is_checked() -> None:
    with pytest.raises(ValueError, match="kind: slurm needs a slurm section"):
        ExecutorSpec.model_validate({"kind": "slurm"})
    with pytest.raises(ValueError, match="at least one of gres_type"):
        SlurmSettings.model_validate({"partition": "gpu", "pools": {"a": {}}})
    spec = ExecutorSpec.model_validate(
        {"kind": "slurm", "slurm": {**SETTINGS.model_dump(), "pending_timeout": "2m"}}
    )
    assert spec.slurm is not None and spec.slurm.pending_timeout == 120


def test_a_slurm_that_would_preempt_oversubscribe_or_forget_is_refused() -> None:
    good = {"PreemptType": "preempt/none", "SelectType": "select/cons_tres", "MinJobAge": "300 sec"}
    partition = {"OverSubscribe": "NO", "State": "UP", "PreemptMode": "OFF"}
    assert config_problems(good, partition) == []
    bad = {**good, "PreemptType": "preempt/qos", "SelectType": "select/linear", "MinJobAge": "2"}
    problems = config_problems(bad, {**partition, "OverSubscribe": "FORCE:4", "State": "DOWN"})
    text = "\n".join(problems)
    for needle in ("PreemptType=preempt/none", "select/cons_tres", "MinJobAge", "OverSubscribe=NO"):
        assert needle in text
    assert "State is DOWN" in text
    assert config_problems(good, None) == [
        "the partition does not exist: create it or fix executor.slurm.partition"
    ]


def job(state: str, **fields: object) -> dict[str, object]:
    return {
        "job_id": 7,
        "name": "allot-j-1-2",
        "comment": "allotment job=j-1 attempt=2 replicas=worker-0,worker-1",
        "job_state": state,
        "state_reason": "None",
        "start_time": 100,
        "end_time": 200,
        "submit_time": 90,
        "exit_code": 0,
        **fields,
    }


def one(raw: dict[str, object]) -> SlurmJob:
    (parsed,) = parse_jobs({"jobs": [raw, {"job_id": 1, "comment": "someone else's"}]})
    return parsed


def status(raw: dict[str, object], *, stopped: bool = False, now: float = 300.0) -> ReplicaStatus:
    return status_of(one(raw), now=now, stop_requested=stopped, pending_since=90, timeout=60)


def test_jobs_are_found_by_their_comment_with_every_replica() -> None:
    parsed = one(job("RUNNING"))
    assert (parsed.job_id, parsed.attempt, parsed.slurm_id) == ("j-1", 2, 7)
    assert parsed.keys == (ReplicaKey("j-1", 2, "worker", 0), ReplicaKey("j-1", 2, "worker", 1))
    assert comment_for("j-1", 2, parsed.keys) == job("RUNNING")["comment"]


@pytest.mark.parametrize(
    ("raw", "stopped", "failure"),
    [
        (job("COMPLETED"), False, None),
        (job("FAILED", exit_code=3 << 8), False, FailureClass.USER_CODE),
        (job("FAILED", exit_code=9), False, FailureClass.USER_CODE),
        (job("OUT_OF_MEMORY", exit_code=0), False, FailureClass.OOM),
        (job("TIMEOUT"), False, FailureClass.TIMEOUT),
        (job("NODE_FAIL"), False, FailureClass.NODE_FAILURE),
        (job("BOOT_FAIL"), False, FailureClass.NODE_FAILURE),
        (job("CANCELLED"), False, FailureClass.NODE_FAILURE),  # not by Allotment
        (job("CANCELLED"), True, FailureClass.USER_CODE),  # the loop knows why it stopped it
    ],
)
def test_slurm_endings_map_to_failure_classes(
    raw: dict[str, object], stopped: bool, failure: FailureClass | None
) -> None:
    seen = status(raw, stopped=stopped)
    assert seen.ended
    assert classify(seen) is failure


def test_exit_codes_of_newer_slurm_are_read_too() -> None:
    newer = job(
        "FAILED",
        job_state=["FAILED"],
        exit_code={"status": ["ERROR"], "return_code": {"set": True, "number": 4}},
        end_time={"set": True, "number": 250},
    )
    seen = status(newer)
    assert seen.exit_code == 4 and seen.ended_at == 250


def test_a_pending_job_starts_unless_it_is_stuck_or_late() -> None:
    assert status(job("PENDING", state_reason="Resources"), now=100).phase is ReplicaPhase.STARTING
    stuck = status(job("PENDING", state_reason="ReqNodeNotAvail"), now=100)
    assert stuck.phase is ReplicaPhase.LOST
    late = status(job("PENDING", state_reason="Resources"), now=200)
    assert late.phase is ReplicaPhase.LOST
    running = status(job("COMPLETING"))
    assert running.phase is ReplicaPhase.RUNNING


def request(
    node: str, gpus: int, index: int, cpu: int = 2000, memory: int = 1 << 30
) -> LaunchRequest:
    return LaunchRequest(
        job_id="j-1",
        attempt=1,
        index=index,
        command=["python", "train.py", "--name", "it's"],
        env={"A": "x y"},
        workdir=Path("/w"),
        devices=tuple(range(gpus)),
        cpu_millis=cpu,
        memory_bytes=memory,
        node=node,
    )


def test_an_even_gang_is_one_job_pinned_to_its_nodes() -> None:
    shares = node_shares([request("a1", 4, 0), request("a2", 4, 1)])
    argv = sbatch_argv(
        shares=shares,
        gres_types={"a1": "a100", "a2": "a100"},
        partition="gpu",
        name="allot-j-1-1",
        comment="c",
        output="/w/o",
        workdir="/w",
        exports=["PATH"],
        max_runtime=3601,
        account=None,
        qos="high",
        script="/w/b.sh",
    )
    for option in (
        "--nodelist=a1,a2",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gres=gpu:a100:4",
        "--cpus-per-task=2",
        "--mem=1024M",
        "--time=61",
        "--no-requeue",
        "--qos=high",
        "--export=PATH",
    ):
        assert option in argv
    assert ":" not in argv and argv[-1] == "/w/b.sh"


def test_an_uneven_gang_is_a_heterogeneous_job() -> None:
    shares = node_shares([request("a1", 2, 0), request("a1", 2, 1), request("a2", 2, 2)])
    gres = {"a1": "a100", "a2": "a100"}
    assert not is_uniform(shares, gres)
    argv = sbatch_argv(
        shares=shares,
        gres_types=gres,
        partition="gpu",
        name="n",
        comment="c",
        output="o",
        workdir="/w",
        exports=["PATH"],
        max_runtime=None,
        account=None,
        qos=None,
        script="s",
    )
    first, second = " ".join(argv).split(" : ")
    assert (
        "--nodelist=a1" in first and "--gres=gpu:a100:4" in first and "--cpus-per-task=4" in first
    )
    assert "--nodelist=a2" in second and "--gres=gpu:a100:2" in second


def test_the_launcher_quotes_what_users_wrote_and_splits_the_devices() -> None:
    shares = node_shares([request("a1", 2, 0), request("a1", 2, 1)])
    script = launcher_script(shares, "TERM")
    assert "'it'\"'\"'s'" in script  # the quote survives the shell
    assert "export A='x y'" in script
    assert '"$(slice 0 2)"' in script and '"$(slice 2 2)"' in script
    with pytest.raises(UnsupportedRequest):
        node_shares([LaunchRequest(job_id="j", attempt=1, command=["x"], workdir=Path("/"))])


@given(
    st.lists(
        st.tuples(st.sampled_from(["a1", "a2", "a3"]), st.integers(0, 4)), min_size=1, max_size=8
    )
)
def test_shares_hold_exactly_the_replicas_resources(placed: list[tuple[str, int]]) -> None:
    requests = [request(node, gpus, i) for i, (node, gpus) in enumerate(placed)]
    shares = node_shares(requests)
    assert sum(s.gpus for s in shares) == sum(g for _, g in placed)
    assert sorted(r.index for s in shares for r in s.replicas) == list(range(len(placed)))
    for share in shares:
        assert all(r.node == share.node for r in share.replicas)
        assert share.cpus == 2 * len(share.replicas)


def test_stop_signals_are_the_configured_one() -> None:
    script = launcher_script(node_shares([request("a1", 1, 0)]), "USR1")
    assert "trap 'kill -USR1" in script and script.count("USR1") == 2
    assert int(signal.SIGTERM) == 15


def test_the_example_slurm_cluster_loads_and_nodes_beside_slurm_are_refused() -> None:
    from allotment.domain.errors import ConfigError
    from allotment.domain.loading import load_cluster, load_cluster_text

    example = Path(__file__).resolve().parents[2] / "examples" / "cluster-slurm.yaml"
    cluster = load_cluster(example)
    assert cluster.executor.slurm is not None and cluster.nodes == {}
    text = example.read_text() + "nodes:\n  - {name: n1, pool: a100, capacity: {gpu: 1}}\n"
    with pytest.raises(ConfigError, match="the nodes come from Slurm"):
        load_cluster_text(text)
    unknown = example.read_text().replace("h100: {gres_type: h100}", "v100: {gres_type: v100}")
    with pytest.raises(ConfigError, match="v100"):
        load_cluster_text(unknown)
