from __future__ import annotations

from pathlib import Path

import pytest

from allotment.domain.cluster import Cluster
from allotment.domain.resources import MILLI, Resources
from allotment.sim.trace import TraceError, check_trace, read_trace
from allotment.sim.trace_formats import (
    ALIBABA_OPENB,
    GENERIC,
    PHILLY,
    detect_format,
    load_trace,
    philly_gang,
    read_openb_nodes,
    read_openb_pods,
    read_philly_nodes,
    read_philly_rows,
)

TRACES = Path(__file__).resolve().parents[2] / "traces"
MIB = 2**20 * MILLI

PHILLY_HEADER = "job_id,vc,submit_time_s,duration_s,num_gpus,gpu_time_s,timestamp"
PHILLY_TRACE = f"""{PHILLY_HEADER}
0,aa11,45,30,1,30,2017-10-01 00:00:45
1,bb22,115,61,4,244,2017-10-01 00:01:55
2,aa11,341,53,12,636,2017-10-01 00:05:41
3,bb22,402,67,16,1072,2017-10-01 00:06:42
4,aa11,500,10,32,320,2017-10-01 00:08:20
"""
PHILLY_NODES = "vc,node num\naa11,4\nbb22,2\n"

OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
OPENB_PODS = f"""{OPENB_HEADER}
pod-0,12000,16384,1,1000,,LS,Running,0,1000,0
pod-1,6000,12288,1,460,,BE,Running,10,500,20
pod-2,8000,4096,2,1000,V100M16|V100M32,Burstable,Succeeded,30,130,30
pod-3,4000,2048,0,0,,Guaranteed,Failed,40,90,50
pod-4,2000,1024,1,1000,,ls,Pending,50,400,
pod-5,1000,1024,1,500,T4,be,Running,60,160,60
"""
OPENB_NODES = """sn,cpu_milli,memory_mib,gpu,model
node-0,64000,262144,2,P100
node-1,96000,393216,8,V100M16
node-2,96000,786432,8,V100M32
node-3,104000,524288,2,T4
node-4,104000,524288,2,T4
"""


def lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def write(directory: Path, **files: str) -> Path:
    for name, text in files.items():
        (directory / name.replace("__", ".")).write_text(text)
    return directory


@pytest.fixture
def philly(tmp_path: Path) -> Path:
    write(tmp_path, trace__csv=PHILLY_TRACE)
    (tmp_path / "philly_vc_nodes_helios.csv").write_text(PHILLY_NODES)
    return tmp_path / "trace.csv"


@pytest.fixture
def openb(tmp_path: Path) -> Path:
    write(tmp_path, pods__csv=OPENB_PODS)
    (tmp_path / "alibaba_openb_node_list_gpu_node.csv").write_text(OPENB_NODES)
    return tmp_path / "pods.csv"


# -- format detection -------------------------------------------------------------------


def test_formats_are_told_apart_by_the_header() -> None:
    assert detect_format(PHILLY_HEADER.split(",")) is PHILLY
    assert detect_format([" job_id ", " vc", "submit_time_s", "duration_s", "num_gpus"]) is PHILLY
    assert detect_format(OPENB_HEADER.split(",")) is ALIBABA_OPENB
    assert detect_format(["job_id", "submit_time", "duration", "queue", "gpus", "pool"]) is GENERIC


def test_an_unknown_header_lists_every_format() -> None:
    with pytest.raises(TraceError) as caught:
        detect_format(["id", "colour"], source="t.csv")
    message = caught.value.message
    assert message.startswith("t.csv line 1: unknown trace format; known formats: generic (")
    assert "philly (job_id, vc, submit_time_s, duration_s, num_gpus; optional" in message
    assert "alibaba-openb (name, cpu_milli, memory_mib, num_gpu, gpu_milli" in message
    with pytest.raises(TraceError, match="as a philly trace it lacks num_gpus and has unknown"):
        detect_format(["job_id", "vc", "submit_time_s", "duration_s", "gpus"])
    with pytest.raises(TraceError, match=r"as a generic trace it lacks duration;"):
        detect_format(["job_id", "submit_time", "queue", "gpus"])
    with pytest.raises(TraceError, match=r"column\(s\) vc given twice"):
        detect_format(["job_id", "vc", "vc", "submit_time_s", "duration_s", "num_gpus"])
    with pytest.raises(TraceError, match="empty file"):
        detect_format([])


def test_generic_traces_read_as_before(tmp_path: Path) -> None:
    path = write(tmp_path, t__csv="job_id,submit_time,duration,queue,gpus,pool\na,0,1,q,1,a100\n")
    trace = load_trace(path / "t.csv")
    assert (trace.format, trace.cluster, trace.skipped) == (GENERIC, None, 0)
    (job,) = trace.jobs
    assert (job.pool, job.pools) == ("a100", ("a100",))
    assert read_trace(path / "t.csv") == trace.jobs
    with pytest.raises(TraceError, match="a node file goes with a philly or alibaba-openb"):
        load_trace(path / "t.csv", nodes=path / "t.csv")


# -- Philly -----------------------------------------------------------------------------


def test_philly_jobs_and_gangs(philly: Path) -> None:
    trace = load_trace(philly)
    assert trace.format is PHILLY and trace.skipped == 0
    shapes = [(j.job_id, j.queue, j.replicas, j.gpus // MILLI, j.total_gpus) for j in trace.jobs]
    assert shapes == [
        ("0", "aa11", 1, 1, 1000),
        ("1", "bb22", 1, 4, 4000),
        ("2", "aa11", 2, 6, 12000),
        ("3", "bb22", 2, 8, 16000),
        ("4", "aa11", 4, 8, 32000),
    ]
    first = trace.jobs[0]
    assert (first.submit_time, first.duration, first.line, first.pools) == (45.0, 30.0, 2, ())
    assert [philly_gang(n) for n in (0, 8, 9, 12, 24, 33)] == [
        (1, 0),
        (1, 8),
        (2, 5),
        (2, 6),
        (3, 8),
        (5, 7),
    ]


def test_philly_cluster_from_the_node_file(philly: Path) -> None:
    trace = load_trace(philly)
    cluster = trace.cluster
    assert cluster is not None
    assert trace.nodes_file == str(philly.parent / "philly_vc_nodes_helios.csv")
    # Each VC owns its nodes: a pool per VC, guaranteed to the VC's queue.
    assert list(cluster.pools) == ["vc-aa11", "vc-bb22"]
    assert len(cluster.nodes) == 6
    assert {n.capacity for n in cluster.nodes.values()} == {Resources.of(gpu=8)}
    assert sorted(n.pool for n in cluster.nodes.values()).count("vc-aa11") == 4
    assert [q.name for q in cluster.roots] == ["philly"]
    gpus = {
        (q.name, pool): amounts["gpu"] // MILLI
        for q in cluster.queues.values()
        for pool, amounts in q.nominal.items()
    }
    assert gpus == {
        ("philly", "vc-aa11"): 32,
        ("philly", "vc-bb22"): 16,
        ("aa11", "vc-aa11"): 32,
        ("bb22", "vc-bb22"): 16,
    }
    assert [q.name for q in cluster.leaves] == ["aa11", "bb22"]
    check_trace(trace.jobs, cluster, source=str(philly))


def test_philly_node_file_elsewhere_or_absent(philly: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.csv"
    other.write_text("vc,node num\naa11,1\nbb22,1\ncc33,5\n")
    cluster = load_trace(philly, nodes=other).cluster
    assert cluster is not None and len(cluster.nodes) == 7
    assert load_trace(philly, build_cluster=False).cluster is None
    (philly.parent / "philly_vc_nodes_helios.csv").unlink()
    trace = load_trace(philly)
    assert (trace.cluster, trace.nodes_file, len(trace.jobs)) == (None, None, 5)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(philly, nodes=tmp_path / "absent.csv")


def test_philly_vc_missing_from_the_node_file(philly: Path) -> None:
    (philly.parent / "philly_vc_nodes_helios.csv").write_text("vc,node num\naa11,4\n")
    with pytest.raises(TraceError) as caught:
        load_trace(philly)
    assert caught.value.line == 3
    assert "trace.csv line 3: job 1: vc 'bb22' is not in the node file" in caught.value.message
    assert caught.value.message.endswith("VCs there: aa11")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("9,aa11,10,-5,1,0,x", "duration_s must be a finite, non-negative number"),
        ("9,aa11,soon,5,1,0,x", "submit_time_s must be a number of seconds, got 'soon'"),
        ("9,,10,5,1,0,x", "vc is empty"),
        (",aa11,10,5,1,0,x", "job_id is empty"),
        ("9,aa11,10,5,1.5,0,x", "num_gpus must be a whole number, got '1.5'"),
        ("9,aa11,10,5,-1,0,x", "num_gpus must not be negative"),
        ("9,aa11,10,5,,0,x", "num_gpus is empty"),
        ("9,aa11,10,5,1,0,x,y", "8 cells, the header has 7"),
        ("9,aa11,10,5", "too few cells, the header has 7"),
        ("0,aa11,10,5,1,0,x", "job_id '0' already used on line 2"),
    ],
)
def test_philly_bad_row_names_its_line(row: str, expected: str) -> None:
    text = f"{PHILLY_HEADER}\n0,aa11,45,30,1,30,x\n{row}\n"
    with pytest.raises(TraceError) as caught:
        read_philly_rows(lines(text), source="p.csv")
    assert caught.value.line == 3
    assert caught.value.message.startswith("p.csv line 3: ")
    assert expected in caught.value.message


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("vc,nodes\naa11,4\n", 1, "not a philly node file: its header is vc, nodes; expected"),
        ("vc,node num\naa11,4\naa11,2\n", 3, "vc 'aa11' already used on line 2"),
        ("vc,node num\naa11,0\n", 2, "node num must be at least 1, got 0"),
        ("vc,node num\naa11,many\n", 2, "node num must be a whole number"),
        ("vc,node num\nVC_A,4\n", 2, "vc 'VC_A' is not a valid queue name"),
        ("vc,node num\n", None, "no VCs listed"),
    ],
)
def test_philly_bad_node_file(text: str, line: int | None, expected: str) -> None:
    with pytest.raises(TraceError) as caught:
        read_philly_nodes(lines(text), source="n.csv")
    assert caught.value.line == line
    assert expected in caught.value.message


def test_a_cluster_file_replaces_the_node_file(philly: Path, tiny_cluster: Cluster) -> None:
    jobs = load_trace(philly, build_cluster=False).jobs
    with pytest.raises(TraceError, match="line 2: job 0: unknown queue 'aa11'"):
        check_trace(jobs, tiny_cluster, source=str(philly))


# -- Alibaba openb ----------------------------------------------------------------------


def test_openb_pods(openb: Path) -> None:
    trace = load_trace(openb)
    assert trace.format is ALIBABA_OPENB
    assert (trace.skipped, trace.note) == (
        1,
        "left out 1 pod(s) never scheduled (no scheduled_time)",
    )
    jobs = {j.job_id: j for j in trace.jobs}
    assert list(jobs) == ["pod-0", "pod-1", "pod-2", "pod-3", "pod-5"]
    view = {
        name: (j.submit_time, j.duration, j.gpus, j.replicas, j.cpu, j.memory, j.priority_class)
        for name, j in jobs.items()
    }
    assert view == {
        "pod-0": (0.0, 1000.0, 1000, 1, 12000, 16384 * MIB, "production"),
        "pod-1": (10.0, 480.0, 460, 1, 6000, 12288 * MIB, "experiment"),
        "pod-2": (30.0, 100.0, 2000, 1, 8000, 4096 * MIB, "training"),
        "pod-3": (40.0, 40.0, 0, 1, 4000, 2048 * MIB, "training"),
        "pod-5": (60.0, 100.0, 500, 1, 1000, 1024 * MIB, "experiment"),
    }
    assert {j.queue for j in trace.jobs} == {"openb"}
    assert (jobs["pod-2"].pools, jobs["pod-2"].pool) == (("v100m16", "v100m32"), None)
    assert (jobs["pod-5"].pools, jobs["pod-5"].pool) == (("t4",), "t4")
    assert jobs["pod-0"].pools == ()
    assert trace.cluster is not None
    check_trace(trace.jobs, trace.cluster, source=str(openb))


def test_openb_cluster_from_the_node_file(openb: Path) -> None:
    cluster = load_trace(openb).cluster
    assert cluster is not None
    assert list(cluster.pools) == ["p100", "v100m16", "v100m32", "t4"]
    assert cluster.pools["v100m32"].labels == {"gpu_model": "V100M32"}
    node = cluster.nodes["node-3"]
    assert (node.pool, node.capacity) == (
        "t4",
        Resources.of(gpu=2, cpu="104000m", memory="524288Mi"),
    )
    (queue,) = cluster.leaves
    assert (queue.name, queue.parent) == ("openb", None)
    assert queue.nominal == {
        "p100": Resources.of(gpu=2, cpu=64, memory="256Gi"),
        "v100m16": Resources.of(gpu=8, cpu=96, memory="384Gi"),
        "v100m32": Resources.of(gpu=8, cpu=96, memory="768Gi"),
        "t4": Resources.of(gpu=4, cpu=208, memory="1Ti"),
    }


def test_openb_pools_must_exist(openb: Path) -> None:
    pods = OPENB_PODS + "pod-9,1000,1024,1,1000,H100,LS,Running,70,80,70\n"
    openb.write_text(pods)
    trace = load_trace(openb)
    assert trace.cluster is not None
    with pytest.raises(TraceError, match="line 8: job pod-9: pool 'h100' is not open to queue"):
        check_trace(trace.jobs, trace.cluster, source=str(openb))


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("p,1000,1024,1,1000,,LS,Running,0,5,10", "deletion_time 5 is before scheduled_time 10"),
        ("p,1000,1024,2,500,,LS,Running,0,5,0", "a share of several GPUs (num_gpu 2, gpu_milli"),
        ("p,1000,1024,1,0,,LS,Running,0,5,0", "gpu_milli must be between 1 and 1000 per GPU"),
        ("p,1000,1024,1,1500,,LS,Running,0,5,0", "gpu_milli must be between 1 and 1000"),
        ("p,1000,1024,0,100,,LS,Running,0,5,0", "gpu_milli is 100 for a pod of no GPUs"),
        ("p,1000,1024,1,1000,,VIP,Running,0,5,0", "unknown qos 'VIP'; known (any case): ls ->"),
        ("p,1000,1024,1,1000,,,Running,0,5,0", "qos is empty"),
        ("p,lots,1024,1,1000,,LS,Running,0,5,0", "cpu_milli must be a whole number"),
        ("p,1000,-1,1,1000,,LS,Running,0,5,0", "memory_mib must not be negative"),
        (",1000,1024,1,1000,,LS,Running,0,5,0", "name is empty"),
        ("p,1000,1024,1,1000,,LS,Running,,5,0", "creation_time is empty"),
        ("p,1000,1024,1,1000,,LS,Running,0,,0", "deletion_time is empty"),
        ("p,1000,1024,1,1000,,LS,Running,0,5,x", "scheduled_time must be a number of seconds"),
        ("p,1000,1024,1,1000,A 100,LS,Running,0,5,0", "gpu_spec 'A 100' does not make a pool"),
        ("p,1000,1024,1,1000,,LS,Running,0,5", "too few cells, the header has 11"),
        ("pod-0,1000,1024,1,1000,,LS,Running,0,5,0", "name 'pod-0' already used on line 2"),
    ],
)
def test_openb_bad_row_names_its_line(row: str, expected: str) -> None:
    text = f"{OPENB_HEADER}\npod-0,1000,1024,1,1000,,LS,Running,0,5,0\n{row}\n"
    with pytest.raises(TraceError) as caught:
        read_openb_pods(lines(text), source="o.csv")
    assert caught.value.line == 3
    assert caught.value.message.startswith("o.csv line 3: ")
    assert expected in caught.value.message


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("sn,cpu,memory_mib,gpu,model\n", 1, "not a alibaba-openb node file"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,x,T4\n", 2, "gpu must be a whole number"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,\n", 2, "model is empty"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T 4\n", 2, "model 'T 4' does not make"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\nn,1,1,1,T4\n", 3, "sn 'n' already"),
        ("sn,cpu_milli,memory_mib,gpu,model\n", None, "no nodes listed"),
    ],
)
def test_openb_bad_node_file(text: str, line: int | None, expected: str) -> None:
    with pytest.raises(TraceError) as caught:
        read_openb_nodes(lines(text), source="n.csv")
    assert caught.value.line == line
    assert expected in caught.value.message


def test_openb_reads_from_any_node_file(openb: Path, tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nx,1000,1024,1,A10\n")
    cluster = load_trace(openb, nodes=nodes).cluster
    assert cluster is not None and list(cluster.pools) == ["a10"]
    with pytest.raises(TraceError, match="job pod-2: pool 'v100m16' is not open"):
        check_trace(load_trace(openb, nodes=nodes).jobs, cluster)


# -- the shipped traces -----------------------------------------------------------------


def test_the_shipped_traces() -> None:
    philly = load_trace(TRACES / "philly_helios_window_11vc.csv")
    assert philly.format is PHILLY and philly.cluster is not None
    assert len(philly.jobs) == 68_503
    assert len(philly.cluster.leaves) == 11
    assert sum(n.gpu_count for n in philly.cluster.nodes.values()) == 2_816
    gangs = [j for j in philly.jobs if j.replicas > 1]
    assert len(gangs) == 186
    assert sum(j.gpus != 8 * MILLI for j in gangs) == 7  # the 12-GPU jobs: 2 x 6
    check_trace(philly.jobs, philly.cluster)

    openb = load_trace(TRACES / "alibaba_openb_pod_list_default.csv")
    assert openb.format is ALIBABA_OPENB and openb.cluster is not None
    assert (len(openb.jobs), openb.skipped) == (7_255, 897)
    assert len(openb.cluster.nodes) == 1_213
    assert sum(n.gpu_count for n in openb.cluster.nodes.values()) == 6_212
    assert len(openb.cluster.pools) == 7
    check_trace(openb.jobs, openb.cluster)
