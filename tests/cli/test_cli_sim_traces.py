"""``allot sim`` on Philly and Alibaba traces: the cluster from the trace's node file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from allotment.cli.main import app

runner = CliRunner()

PHILLY = """\
job_id,vc,submit_time_s,duration_s,num_gpus,gpu_time_s,timestamp
0,aa11,0,100,8,800,2017-10-01 00:00:00
1,aa11,10,50,8,400,2017-10-01 00:00:10
2,bb22,20,30,12,360,2017-10-01 00:00:20
"""
PHILLY_NODES = "vc,node num\naa11,1\nbb22,2\n"
PHILLY_CLUSTER = """\
pools:
  - {name: big}
nodes:
  - {name_prefix: n, count: 4, pool: big, capacity: {gpu: 8}}
queues:
  - name: org
    children:
      - {name: aa11, quota: {big: {gpu: 16}}}
      - {name: bb22, quota: {big: {gpu: 16}}}
"""
OPENB = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
pod-0,4000,1024,1,500,,LS,Running,0,100,0
pod-1,4000,1024,1,500,T4,BE,Running,0,100,0
pod-2,4000,1024,1,1000,,LS,Pending,5,100,
"""
OPENB_NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,8192,1,T4\n"


@pytest.fixture
def philly(tmp_path: Path) -> Path:
    (tmp_path / "philly.csv").write_text(PHILLY)
    (tmp_path / "philly_vc_nodes_helios.csv").write_text(PHILLY_NODES)
    return tmp_path / "philly.csv"


def sim(*args: str) -> Result:
    return runner.invoke(app, ["sim", *args])


def summary(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    (data,) = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def test_philly_without_a_cluster_file(philly: Path) -> None:
    data = summary(sim(str(philly), "-p", "fifo-isolated", "-o", "json"))
    assert (data["jobs"], data["finished"]) == (3, 3)
    # aa11 has one node: its second job waits for the first (100 s - 10 s).
    assert data["per_queue"]["aa11"]["wait_avg_s"] == 45
    result = sim(str(philly), "-p", "fifo-isolated")
    assert result.exit_code == 0
    assert "3 jobs on the cluster of" in " ".join(result.stdout.split())


def test_philly_with_a_cluster_file(philly: Path) -> None:
    (philly.parent / "cluster.yaml").write_text(PHILLY_CLUSTER)
    cluster = str(philly.parent / "cluster.yaml")
    data = summary(sim(str(philly), "-f", cluster, "-p", "fifo-isolated", "-o", "json"))
    assert data["per_queue"]["aa11"]["wait_avg_s"] == 0


def test_philly_with_a_node_file_elsewhere(philly: Path, tmp_path: Path) -> None:
    (philly.parent / "philly_vc_nodes_helios.csv").unlink()
    other = tmp_path / "other"
    other.mkdir()
    (other / "vcs.csv").write_text("vc,node num\naa11,2\nbb22,2\n")
    data = summary(sim(str(philly), "--nodes", str(other / "vcs.csv"), "-o", "json"))
    assert data["per_queue"]["aa11"]["wait_avg_s"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "absent.csv"], "node file absent.csv: no such file"),
        (["--nodes", "n.csv", "-f", "c.yaml"], "give a cluster file (-f) or a node file"),
    ],
)
def test_node_file_errors(philly: Path, args: list[str], message: str) -> None:
    result = sim(str(philly), *args)
    assert result.exit_code == 1
    assert message in result.stderr


def test_no_node_file_and_no_cluster_file(
    philly: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (philly.parent / "philly_vc_nodes_helios.csv").unlink()
    monkeypatch.chdir(tmp_path)
    result = sim(str(philly))
    assert result.exit_code == 1
    assert result.stderr == (
        "error: no cluster for this philly trace: put philly_vc_nodes_helios.csv next to it, "
        "or give --nodes FILE or -f cluster.yaml\n"
    )
    (tmp_path / "cluster.yaml").write_text(PHILLY_CLUSTER)
    assert summary(sim(str(philly), "-o", "json"))["finished"] == 3


def test_bad_philly_row_is_one_message(philly: Path) -> None:
    philly.write_text(PHILLY + "3,cc33,30,10,1,10,x\n")
    result = sim(str(philly))
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "philly.csv line 5: job 3: vc 'cc33' is not in the node file" in result.stderr


def test_openb_notes_the_pods_left_out(tmp_path: Path) -> None:
    (tmp_path / "pods.csv").write_text(OPENB)
    (tmp_path / "alibaba_openb_node_list_gpu_node.csv").write_text(OPENB_NODES)
    result = sim(str(tmp_path / "pods.csv"), "-p", "fifo-isolated", "-o", "json")
    data = summary(result)
    assert (data["jobs"], data["finished"], data["wait_avg_s"]) == (2, 2, 0)
    assert "left out 1 pod(s) never scheduled (no scheduled_time)" in result.stderr


def test_unknown_trace_format(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("id,colour\n1,red\n")
    result = sim(str(tmp_path / "t.csv"), "--nodes", str(tmp_path / "t.csv"))
    assert result.exit_code == 1
    assert "t.csv line 1: unknown trace format; known formats: generic (" in result.stderr
    assert result.stderr.count("\n") == 1
