"""Reading cluster and job files: the examples, and every kind of mistake a user makes."""

from __future__ import annotations

import csv
import importlib.util
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest

from allotment.domain.cluster import Cluster, NodeEntry
from allotment.domain.errors import ConfigError, InvalidInput, Issue
from allotment.domain.job import JobSpec, JobType
from allotment.domain.lifecycle import FailureClass
from allotment.domain.loading import (
    MAX_DEPTH,
    check_job,
    load_cluster,
    load_cluster_text,
    load_job,
    load_job_text,
    parse_yaml,
)
from allotment.domain.notebook import serving_notebook
from allotment.domain.resources import GPU, Resources

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB_FILES = sorted((EXAMPLES / "jobs").glob("*.yaml"))


def problems(text: str, *, job: bool = False) -> list[Issue]:
    """The issues a cluster (or job) text is refused with."""
    loader = load_job_text if job else load_cluster_text
    with pytest.raises(ConfigError) as info:
        loader(textwrap.dedent(text), source="test.yaml")
    assert info.value.code == "invalid_config"
    assert info.value.source == "test.yaml"
    return info.value.issues


def one_problem(text: str, *, job: bool = False) -> Issue:
    issues = problems(text, job=job)
    assert len(issues) == 1, issues
    return issues[0]


@pytest.fixture(scope="module")
def example() -> Cluster:
    return load_cluster(EXAMPLES / "cluster.yaml")


SMALL = """\
pools: [{name: a100}, {name: l40s}]
tenants: [{name: vision}, {name: nlp}]
queues:
  - name: research
    quota: {a100: {gpu: 16}}
    children:
      - {name: vision-train, tenant: vision, quota: {a100: {gpu: 8}}}
      - {name: nlp-train, tenant: nlp, quota: {a100: {gpu: 8}}, pools: [a100],
         priority_classes: [training, experiment]}
"""


# --- the examples -----------------------------------------------------------------


def test_example_cluster_loads(example: Cluster) -> None:
    assert list(example.priority_classes) == [
        "production",
        "key-project",
        "training",
        "experiment",
        "scavenger",
    ]
    assert not example.priority_classes["production"].preemptible
    assert example.priority_classes["scavenger"].borrow_only
    assert set(example.pools) == {"h100", "a100", "l40s"}
    assert all(pool.price_per_gpu_hour > 0 for pool in example.pools.values())
    assert len(example.tenants) == 5
    assert len(example.leaves) == 8
    assert all(queue.tenant for queue in example.leaves)
    assert any(queue.time_windows for queue in example.leaves)
    roles = {m.role.value for t in example.tenants.values() for m in t.members}
    assert roles == {"admin", "member", "viewer"}


def test_example_nodes_span_racks(example: Cluster) -> None:
    for pool in example.pools:
        nodes = [n for n in example.nodes.values() if n.pool == pool]
        assert 4 <= len(nodes) <= 8
        assert len({n.topology["rack"] for n in nodes}) >= 2
        assert all(n.gpu_count == 8 and n.capacity["cpu"] and n.capacity["memory"] for n in nodes)


def test_example_guarantees_fit_their_parents(example: Cluster) -> None:
    for queue in example.queues.values():
        for pool, own in queue.spec.quota.items():
            for key, amount in own.items():
                children = sum(c.nominal.get(pool, Resources())[key] for c in queue.children)
                assert children <= amount, (queue.name, pool, key)


def test_local_example_loads() -> None:
    local = load_cluster(EXAMPLES / "cluster-local.yaml")
    assert list(local.pools) == ["local"]
    assert list(local.nodes) == ["localhost"]
    assert local.nodes["localhost"].capacity == Resources.of(gpu=2, cpu=8, memory="16Gi")
    assert len(local.tenants) == 1
    assert len(local.leaves) == 2


def test_there_is_one_job_file_per_type() -> None:
    types = sorted(load_job(path).type.value for path in JOB_FILES)
    assert types == sorted(t.value for t in JobType)


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.stem for p in JOB_FILES])
def test_example_job_is_valid_on_the_example_cluster(path: Path, example: Cluster) -> None:
    job = load_job(path)
    assert check_job(job, example) == []
    if job.type is JobType.NOTEBOOK and not job.command:  # the server runs JupyterLab
        job = serving_notebook(job, job_id="j-1", port=8888, token="t", python="python3")
    assert job.command, "the local executor needs a command"
    assert job.command[0] in {"python3", "sh", "sleep"}
    assert job.total_resources()[GPU] <= 2000, "small enough for a workstation"


def test_example_gang_has_two_replicas() -> None:
    job = load_job(EXAMPLES / "jobs" / "training.yaml")
    assert job.replica_count == 2
    assert job.retry is not None and FailureClass.NODE_FAILURE in job.retry.on


def _make_trace() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_trace", EXAMPLES / "make_trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_trace_is_what_the_script_writes() -> None:
    module = _make_trace()
    with (EXAMPLES / "trace.csv").open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == module.COLUMNS
        rows = list(reader)
    expected = [{k: str(v) for k, v in row.items()} for row in module.make_rows()]
    assert rows == expected


def test_trace_fits_the_example_cluster(example: Cluster) -> None:
    with (EXAMPLES / "trace.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 200
    assert len({r["job_id"] for r in rows}) == len(rows)
    submits = [int(r["submit_time"]) for r in rows]
    assert submits == sorted(submits)
    gangs = 0
    for row in rows:
        queue = example.queues[row["queue"]]
        assert queue.is_leaf
        pools = [row["pool"]] if row["pool"] else example.allowed_pools(queue)
        assert set(pools) <= set(example.allowed_pools(queue)), row
        assert example.priority_class_for(queue, row["priority_class"] or None), row
        replica = Resources.of(gpu=row["gpus"], cpu=row["cpu"], memory=row["memory"])
        replicas = int(row["replicas"])
        gangs += replicas > 1
        limit = queue.spec.max_job
        if limit is not None:
            assert (replica * replicas).fits_in(
                limit.as_dict() | {k: v for k, v in (replica * replicas).items() if k not in limit}
            ), row
        nodes = [n for n in example.nodes.values() if n.pool in pools]
        assert any(replica.fits_in(n.capacity) for n in nodes), row
        assert int(row["duration"]) > 0
    assert gangs >= 3
    assert {int(r["gpus"]) for r in rows} >= {1, 2, 4, 8}


# --- unknown keys, bad values, and where they are --------------------------------


def test_unknown_key_names_the_key_and_its_line() -> None:
    issue = one_problem("""\
        pools: [{name: a100}]
        queues:
          - name: research
            quotaa: {a100: {gpu: 1}}
        """)
    assert issue.path == "queues.0.quotaa"
    assert issue.line == 4
    assert "'quotaa' (did you mean 'quota'?)" in issue.message
    assert "line 4" in str(issue)


def test_unknown_key_in_a_job_file() -> None:
    issue = one_problem(
        """\
        name: j
        queue: q
        replicas: [{resources: {gpu: 1}}]
        comand: [python3]
        """,
        job=True,
    )
    assert (issue.path, issue.line) == ("comand", 4)
    assert "(did you mean 'command'?)" in issue.message


def test_unknown_key_lists_what_is_allowed_there() -> None:
    issue = one_problem("""\
        pools: [{name: a}]
        queues:
          - name: org
            children:
              - name: team
                priorty_classes: [training]
        """)
    assert issue.path == "queues.0.children.0.priorty_classes"
    assert issue.line == 6
    assert issue.message.startswith(
        "unknown key 'priorty_classes' (did you mean 'priority_classes'?); allowed here: "
    )
    assert "borrowing_limit" in issue.message and "time_windows" in issue.message


def test_missing_required_key() -> None:
    issue = one_problem("name: j\nqueue: q\n", job=True)
    assert issue.path == "replicas"
    assert "missing" in issue.message


@pytest.mark.parametrize(
    ("text", "path", "line", "words"),
    [
        pytest.param(
            "pools: [{name: a}]\nnodes:\n  - name: n1\n    pool: a\n    capacity: {gpu: 8x}\n",
            "nodes.0.capacity",
            5,
            "unknown suffix",
            id="node-capacity",
        ),
        pytest.param(
            "pools: [{name: a}]\nqueues:\n  - name: q\n    quota:\n      a: {cpu: -2}\n",
            "queues.0.quota.a",
            5,
            "negative",
            id="negative-quota",
        ),
        pytest.param(
            "queues:\n  - name: q\n    max_wait: soon\n",
            "queues.0.max_wait",
            3,
            "duration",
            id="bad-duration",
        ),
        pytest.param(
            "queues:\n  - name: q\n    time_windows: [{days: mon, from: '25:00', to: '08:00'}]\n",
            "queues.0.time_windows.0",
            3,
            "hours",
            id="bad-window",
        ),
        pytest.param(
            "queues:\n  - name: Research\n",
            "queues.0.name",
            2,
            "pattern",
            id="bad-name",
        ),
    ],
)
def test_bad_values_name_path_and_line(text: str, path: str, line: int, words: str) -> None:
    issue = one_problem(text)
    assert (issue.path, issue.line) == (path, line)
    assert words in issue.message


def test_bad_quantity_in_a_job() -> None:
    issue = one_problem(
        """\
        name: j
        queue: q
        replicas:
          - name: worker
            resources: {gpu: 1, memory: 0.0001}
        """,
        job=True,
    )
    assert (issue.path, issue.line) == ("replicas.0.resources", 5)
    assert "thousandth" in issue.message


def test_every_problem_is_reported_at_once() -> None:
    issues = problems("""\
        pools: [{name: a, colour: red}]
        queues:
          - {name: q, max_wait: soon, weight: 0}
        """)
    assert {i.path for i in issues} == {"pools.0.colour", "queues.0.max_wait", "queues.0.weight"}


# --- cross-references --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "known"),
    [
        pytest.param(
            "pools: [{name: a100}, {name: l40s}]\nqueues:\n  - {name: q, pools: [h100]}\n",
            "queues.0.pools.0",
            "known: a100, l40s",
            id="queue-pool",
        ),
        pytest.param(
            "pools: [{name: a100}]\nqueues:\n  - {name: q, quota: {h100: {gpu: 1}}}\n",
            "queues.0.quota.h100",
            "known: a100",
            id="quota-pool",
        ),
        pytest.param(
            "pools: [{name: a100}]\nqueues:\n  - {name: q, borrowing_limit: {x: {gpu: 1}}}\n",
            "queues.0.borrowing_limit.x",
            "known: a100",
            id="borrowing-pool",
        ),
        pytest.param(
            "pools: [{name: a100}]\nnodes:\n  - {name: n, pool: h100, capacity: {gpu: 8}}\n",
            "nodes.0.pool",
            "known: a100",
            id="node-pool",
        ),
        pytest.param(
            "tenants: [{name: vision}, {name: nlp}]\nqueues:\n  - {name: q, tenant: speech}\n",
            "queues.0.tenant",
            "known: nlp, vision",
            id="tenant",
        ),
        pytest.param(
            "queues:\n  - {name: q, priority_classes: [gold]}\n",
            "queues.0.priority_classes.0",
            "known: experiment, key-project, production, scavenger, training",
            id="priority-class",
        ),
        pytest.param(
            "priority_classes: [{name: high, value: 10}]\n"
            "queues:\n  - {name: q, default_priority_class: low}\n",
            "queues.0.default_priority_class",
            "known: high",
            id="default-priority-class",
        ),
        pytest.param(
            "pools: [{name: a100, queues: [research]}]\nqueues:\n  - {name: q}\n",
            "pools.0.queues.0",
            "known: q",
            id="pool-access-list",
        ),
    ],
)
def test_unknown_references_list_the_known_names(text: str, path: str, known: str) -> None:
    issue = one_problem(text)
    assert issue.path == path
    assert "unknown" in issue.message
    assert known in issue.message
    # The reference sits on the file's last line, except the pool access list (line 1).
    assert issue.line == (1 if path.startswith("pools.") else text.count("\n"))


def test_default_priority_class_must_be_allowed_by_the_queue() -> None:
    issue = one_problem(
        "queues:\n  - {name: q, priority_classes: [training], default_priority_class: scavenger}\n"
    )
    assert issue.path == "queues.0.default_priority_class"
    assert "not among" in issue.message


def test_children_guarantees_must_fit_in_the_parent() -> None:
    issue = one_problem("""\
        pools: [{name: a100}]
        queues:
          - name: org
            quota: {a100: {gpu: 8}}
            children:
              - name: research
                quota: {a100: {gpu: 16}}
                children:
                  - {name: vision, quota: {a100: {gpu: 10}}}
                  - {name: nlp, quota: {a100: {gpu: 6}}}
              - {name: product, quota: {a100: {gpu: 0}}}
        """)
    assert issue.path == "queues.0.quota.a100.gpu"
    assert issue.line == 4
    assert "children of queue org guarantee 16 gpu in pool a100" in issue.message
    assert "more than its 8" in issue.message


def test_children_guarantees_checked_at_every_level() -> None:
    issues = problems("""\
        pools: [{name: a100}]
        queues:
          - name: org
            quota: {a100: {gpu: 64, memory: 1Ti}}
            children:
              - name: research
                quota: {a100: {gpu: 8}}
                children:
                  - {name: vision, quota: {a100: {gpu: 6, memory: 1Ti}}}
                  - {name: nlp, quota: {a100: {gpu: 6, memory: 1Gi}}}
        """)
    assert [(i.path, i.line) for i in issues] == [
        ("queues.0.quota.a100.memory", 4),
        ("queues.0.children.0.quota.a100.gpu", 7),
    ]


def test_inner_queue_without_quota_guarantees_its_childrens_sum() -> None:
    cluster = load_cluster_text(SMALL.replace("    quota: {a100: {gpu: 16}}\n", ""))
    assert cluster.queues["research"].nominal["a100"] == Resources.of(gpu=16)


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        pytest.param("pools: [{name: a}, {name: a}]\n", "pools.1.name", "duplicate 'a'", id="pool"),
        pytest.param(
            "tenants: [{name: t}, {name: t}]\n", "tenants.1.name", "duplicate 't'", id="tenant"
        ),
        pytest.param(
            "priority_classes: [{name: p, value: 1}, {name: p, value: 2}]\n",
            "priority_classes.1.name",
            "duplicate 'p'",
            id="priority-class",
        ),
        pytest.param(
            "queues:\n  - name: a\n    children: [{name: b}]\n  - name: b\n",
            "queues.1",
            "duplicate queue name 'b'",
            id="queue-across-subtrees",
        ),
        pytest.param(
            "pools: [{name: p}]\nnodes:\n"
            "  - {name_prefix: n-, count: 3, pool: p, capacity: {gpu: 1}}\n"
            "  - {name: n-02, pool: p, capacity: {gpu: 1}}\n",
            "nodes.1",
            "duplicate node 'n-02'",
            id="node-from-prefix",
        ),
    ],
)
def test_duplicate_names(text: str, path: str, words: str) -> None:
    issue = one_problem(text)
    assert issue.path == path
    assert words in issue.message
    assert issue.line is not None


# --- YAML itself ---------------------------------------------------------------------


def test_invalid_yaml_reports_its_line() -> None:
    issue = one_problem("pools:\n  - name: a\n  - {name: b\nqueues: []\n")
    assert "not valid YAML" in issue.message
    assert issue.line is not None and issue.line >= 4


def test_tab_indentation_is_invalid_yaml_with_a_line() -> None:
    issue = one_problem("pools:\n\t- name: a\n")
    assert "not valid YAML" in issue.message
    assert issue.line == 2


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(text: str) -> None:
    issue = one_problem(text)
    assert "mapping" in issue.message


@pytest.mark.parametrize(
    "text",
    [
        "pools: !!python/object:collections.OrderedDict {}\n",
        "pools: !!python/object/apply:os.system ['true']\n",
        "pools: !!python/name:os.system\n",
        "x: !custom 1\n",
    ],
)
def test_unsafe_tags_are_refused(text: str) -> None:
    issue = one_problem(text)
    assert "not valid YAML" in issue.message
    assert "constructor" in issue.message


def test_nesting_at_the_limit_parses_and_deeper_is_refused() -> None:
    assert parse_yaml("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))[0] is not None
    issue = one_problem("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert f"deeper than {MAX_DEPTH}" in issue.message


def test_very_deep_nesting_is_refused_not_a_crash() -> None:
    issue = one_problem("a: " + "[" * 5000 + "]" * 5000)  # was a RecursionError
    assert "deeper" in issue.message


def test_nesting_through_aliases_is_refused() -> None:
    deep = "[" * 20 + "]" * 20
    issue = one_problem(f"a: &a {deep}\nb: [[[[[[[[[[[[[[[[*a]]]]]]]]]]]]]]]]\n")
    assert "deeper" in issue.message


def test_alias_bombs_are_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    started = time.perf_counter()
    issue = one_problem("\n".join(lines) + "\n")
    assert "aliases" in issue.message
    assert time.perf_counter() - started < 5


def test_yaml_1_1_booleans_and_sexagesimals_are_not_applied() -> None:
    """The documented job file writes ``retry: {on: [...]}`` and labels like ``network: yes``; in
    YAML 1.1 ``on`` and ``yes`` are booleans and ``20:00`` is the number 1200."""
    cluster = load_cluster_text(
        textwrap.dedent("""\
        pools: [{name: a, labels: {ib: yes, nvlink: off}}]
        queues:
          - name: q
            retry: {max_attempts: 2, on: [oom], backoff: 1m}
            time_windows: [{days: mon-fri, from: 20:00, to: 08:00}]
        """)
    )
    assert cluster.pools["a"].labels == {"ib": "yes", "nvlink": "off"}
    retry = cluster.queues["q"].spec.retry
    assert retry is not None and retry.on == [FailureClass.OOM]
    assert cluster.queues["q"].time_windows[0].start == 20 * 60
    data, _ = parse_yaml("a: true\nb: False\nc: 12\nd: 0x10\ne: 1.5\nf: ~\n")
    assert data == {"a": True, "b": False, "c": 12, "d": 16, "e": 1.5, "f": None}


def test_empty_file_is_an_empty_cluster_with_default_priority_classes() -> None:
    cluster = load_cluster_text("")
    assert not cluster.queues and not cluster.pools
    assert "training" in cluster.priority_classes


def test_unreadable_file() -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        load_job(EXAMPLES / "jobs" / "no-such-job.yaml")


# --- node entries ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "names"),
    [
        ({"name": "gpu-box"}, ["gpu-box"]),
        ({"name_prefix": "a100-", "count": 3}, ["a100-01", "a100-02", "a100-03"]),
        ({"name_prefix": "a100-", "count": 3, "start": 9}, ["a100-09", "a100-10", "a100-11"]),
        ({"name_prefix": "n", "count": 2, "start": 0}, ["n00", "n01"]),
        ({"name_prefix": "h-", "count": 100}, [f"h-{i:03d}" for i in range(1, 101)]),
    ],
)
def test_name_prefix_expansion(entry: dict[str, object], names: list[str]) -> None:
    spec = NodeEntry.model_validate(
        {**entry, "pool": "p", "capacity": {"gpu": 8}, "topology": {"rack": "r1"}}
    )
    nodes = spec.expand()
    assert [n.name for n in nodes] == names
    assert all(n.topology == {"rack": "r1"} and n.gpu_count == 8 for n in nodes)


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"name": "x", "name_prefix": "x-", "count": 2},
        {"name_prefix": "x-"},
        {"name": "x", "count": 2},
        {"name_prefix": "x-", "count": 0},
    ],
)
def test_bad_node_entries(entry: dict[str, object]) -> None:
    text = (
        "pools: [{name: p}]\nnodes:\n  - "
        + repr({**entry, "pool": "p", "capacity": {"gpu": 1}}).replace("'", "")
        + "\n"
    )
    issue = one_problem(text)
    assert issue.path.startswith("nodes.0")
    assert issue.line == 3


def test_expanded_nodes_are_in_the_cluster(example: Cluster) -> None:
    assert [n for n in example.nodes if n.startswith("h100-")] == [
        f"h100-0{i}" for i in range(1, 7)
    ]
    assert example.nodes["a100-05"].topology["rack"] == "a100-r2"


# --- jobs against a cluster ------------------------------------------------------------


def _job(**fields: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "j",
        "queue": "vision-train",
        "replicas": [{"resources": {"gpu": 1}}],
    }
    return JobSpec.model_validate(base | fields)


@pytest.fixture(scope="module")
def small() -> Cluster:
    return load_cluster_text(SMALL)


def test_check_job_accepts_a_good_job(small: Cluster) -> None:
    assert check_job(_job(pools=["a100", "l40s"]), small) == []


def test_check_job_unknown_queue_lists_the_leaves(small: Cluster) -> None:
    [issue] = check_job(_job(queue="vision"), small)
    assert issue.path == "queue"
    assert "unknown queue 'vision'" in issue.message
    assert "nlp-train, vision-train" in issue.message


def test_check_job_on_an_inner_queue(small: Cluster) -> None:
    [issue] = check_job(_job(queue="research"), small)
    assert "child queues" in issue.message
    assert "nlp-train, vision-train" in issue.message


@pytest.mark.parametrize(
    ("queue", "priority_class", "allowed"),
    [
        ("nlp-train", "production", "allowed: training, experiment"),
        ("vision-train", "platinum", "allowed: experiment, key-project"),
    ],
)
def test_check_job_priority_class(
    small: Cluster, queue: str, priority_class: str, allowed: str
) -> None:
    [issue] = check_job(_job(queue=queue, priority_class=priority_class), small)
    assert issue.path == "priority_class"
    assert allowed in issue.message


def test_check_job_pools(small: Cluster, example: Cluster) -> None:
    [issue] = check_job(_job(queue="nlp-train", pools=["a100", "l40s"]), small)
    assert issue.path == "pools.1"
    assert "open pools: a100" in issue.message
    # h100's access list names research, serving and eval; notebooks is in product.
    [issue] = check_job(_job(queue="notebooks", pools=["h100"]), example)
    assert "not open to queue notebooks" in issue.message
    assert "open pools: a100, l40s" in issue.message
    # A queue reaches an access-listed pool through its ancestor research.
    assert check_job(_job(queue="vision-train", pools=["h100"]), example) == []


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"service": {"port": 80}}, "service settings need type: service"),
        ({"type": "notebook", "service": {"port": 80}}, "need type: service"),
        ({"notebook": {"ttl": "1h"}}, "notebook settings need type: notebook"),
        ({"max_runtime": "1h", "expected_runtime": "2h"}, "must not exceed max_runtime"),
        ({"replicas": [{"name": "w"}, {"name": "w"}]}, "must be unique"),
        ({"replicas": []}, "at least 1"),
        (
            {"type": "service", "service": {"min_replicas": 3, "max_replicas": 2}},
            "replicas.min (3) must not exceed replicas.max (2)",
        ),
        (
            {"type": "service", "service": {"replicas": {"min": 2, "max": 1}}},
            "replicas.min (2) must not exceed replicas.max (1)",
        ),
        (
            {"type": "service", "service": {"min_replicas": 1, "replicas": {"max": 1}}},
            "not both",
        ),
        (
            {"type": "service", "replicas": [{"name": "w", "count": 2}]},
            "a service's job file describes one replica",
        ),
        ({"type": "service", "service": {"health": {"path": "health"}}}, "pattern"),
        ({"type": "sleeping"}, "training"),
    ],
)
def test_job_shape_rules(fields: dict[str, object], words: str) -> None:
    text = "\n".join(
        f"{k}: {v!r}".replace("'", '"')
        for k, v in ({"name": "j", "queue": "q", "replicas": [{"name": "w"}]} | fields).items()
    )
    issues = problems(text, job=True)
    assert any(words in i.message for i in issues), issues


def test_check_job_refuses_a_job_over_the_queue_max_job() -> None:
    cluster = load_cluster_text(
        "pools: [{name: a}]\nqueues: [{name: q, quota: {a: {gpu: 8}}, max_job: {gpu: 4}}]\n"
    )
    job = load_job_text("name: big\nqueue: q\nreplicas: [{count: 3, resources: {gpu: 2}}]\n")
    (issue,) = check_job(job, cluster)
    assert issue.path == "replicas"
    assert issue.message == "queue q accepts jobs up to 4 gpu; this job asks for 6 gpu in all"
    small = load_job_text("name: ok\nqueue: q\nreplicas: [{count: 2, resources: {gpu: 2}}]\n")
    assert check_job(small, cluster) == []


def test_numbers_written_as_labels_topology_and_env_are_text() -> None:
    cluster = load_cluster_text(
        "pools: [{name: a, labels: {cuda: 12.4, generation: 3}}]\n"
        "nodes: [{name: n1, pool: a, capacity: {gpu: 1}, topology: {rack: 103959}}]\n"
    )
    assert cluster.pools["a"].labels == {"cuda": "12.4", "generation": "3"}
    assert cluster.nodes["n1"].topology == {"rack": "103959"}
    job = load_job_text(
        "name: j\nqueue: q\nreplicas: [{count: 1}]\nenv: {NCCL_DEBUG: 1, TRACE: true}\n"
    )
    assert job.env == {"NCCL_DEBUG": "1", "TRACE": "true"}
    with pytest.raises(ConfigError) as caught:
        load_job_text("name: j\nqueue: q\nreplicas: [{count: 1}]\nenv: {X: [1, 2]}\n")
    assert caught.value.issues[0].path == "env.X"


@pytest.mark.parametrize("name", ["A;rm -rf", "1X", "X Y", "A)", "X\nY", ""])
def test_environment_names_are_what_a_shell_accepts(name: str) -> None:
    """Executors write the names into scripts (Slurm's launcher): only shell names pass."""
    with pytest.raises(ConfigError) as caught:
        load_job_text(f"name: j\nqueue: q\nreplicas: [{{count: 1}}]\nenv: {{{name!r}: x}}\n")
    assert caught.value.issues[0].path.startswith("env")


def test_json_job_issue_has_its_line_found_only_for_the_issue() -> None:
    ok = (
        '{\n  "name": "a",\n  "queue": "q",\n  "command": ["true"],\n'
        '  "replicas": [{"name": "w"}]\n}'
    )
    assert load_job_text(ok).name == "a"
    bad = ok.replace('"command"', '"comand"')
    with pytest.raises(ConfigError) as err:
        load_job_text(bad, source="spec")
    (issue,) = [i for i in err.value.issues if i.path == "comand"]
    assert issue.line == 4


def test_yaml_construction_error_is_reported_after_one_parse() -> None:
    with pytest.raises(ConfigError) as err:
        parse_yaml("a: 1\n? [x, y]\n: 2\n")
    assert "not valid YAML" in err.value.issues[0].message
