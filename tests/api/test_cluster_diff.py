"""The structural diff of ``allot apply``: each changed object names its changed fields
with their old and new JSON values; ``allot apply`` prints them under the object."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from allotment.api.cluster_config import diff, field_changes
from allotment.cli.live_render import diff_view
from allotment.domain.loading import load_cluster_text
from tests.api.conftest import EXAMPLES

LOCAL = (EXAMPLES / "cluster-local.yaml").read_text()
CLASSES = "priority_classes:\n  - {name: training, value: 10}\n  - {name: experiment, value: 5}\n"
BATCH_QUOTA = "gpu: 1, cpu: 4, memory: 8Gi}}\n        default_priority_class: experiment"


def changes(old_text: str, new_text: str) -> dict[str, Any]:
    result = diff(load_cluster_text(old_text), load_cluster_text(new_text))
    return result.model_dump(mode="json")


def paths(section: dict[str, Any], name: str) -> list[tuple[str, Any, Any]]:
    return [(f["path"], f["old"], f["new"]) for f in section["fields"][name]]


def test_a_nominal_gpu_quota_change_is_one_field() -> None:
    new = LOCAL.replace(BATCH_QUOTA, BATCH_QUOTA.replace("gpu: 1", "gpu: 0"))
    queues = changes(LOCAL, new)["queues"]
    assert queues["changed"] == ["batch"]
    assert paths(queues, "batch") == [("spec.quota.local.gpu", "1", "0")]
    assert list(queues["fields"]) == ["batch"]  # the parent's own settings did not change


def test_a_priority_class_value_change() -> None:
    new = CLASSES.replace("value: 5", "value: 7")
    classes = changes(CLASSES + LOCAL, new + LOCAL)["priority_classes"]
    assert classes["changed"] == ["experiment"]
    assert paths(classes, "experiment") == [("value", 5, 7)]


def test_a_nested_list_change_by_index() -> None:
    new = LOCAL.replace("on: [node_failure, preempted]", "on: [preempted]")
    queues = changes(LOCAL, new)["queues"]
    assert paths(queues, "batch") == [
        ("spec.retry.on[0]", "node_failure", "preempted"),
        ("spec.retry.on[1]", "preempted", None),
    ]


def test_added_and_removed_objects_have_no_fields() -> None:
    new = LOCAL.replace("nodes:\n", "nodes:\n  - {name: spare, pool: local, capacity: {gpu: 1}}\n")
    nodes = changes(LOCAL, new)["nodes"]
    assert nodes == {"added": ["spare"], "removed": [], "changed": [], "fields": {}}
    gone = changes(new, LOCAL)["nodes"]
    assert gone == {"added": [], "removed": ["spare"], "changed": [], "fields": {}}


def test_walk_reports_one_sided_keys_and_quotes_odd_keys() -> None:
    old = {"labels": {"zone": "a"}, "limit": None, "list": [1]}
    new = {"labels": {"zone": "a", "example.com/rack": "r1"}, "limit": {"gpu": "2"}, "list": []}
    assert [(c.path, c.old, c.new) for c in field_changes(old, new)] == [
        ('labels["example.com/rack"]', None, "r1"),
        ("limit", None, {"gpu": "2"}),
        ("list[0]", 1, None),
    ]
    assert field_changes(old, old) == []


def shown(result: dict[str, Any]) -> str:
    console = Console(record=True, width=200)
    console.print(diff_view(result))
    return console.export_text()


def test_the_cli_prints_each_field_under_its_object() -> None:
    new = LOCAL.replace(BATCH_QUOTA, BATCH_QUOTA.replace("gpu: 1", "gpu: 0"))
    result = {"dry_run": True, "applied": False, "version": None, "diff": changes(LOCAL, new)}
    text = shown(result)
    assert '  ~ queues: batch\n      spec.quota.local.gpu: "1" → "0"\n' in text


def test_the_cli_shortens_long_values_and_reads_no_markup() -> None:
    field = {"path": "description", "old": "[bold]x[/bold]", "new": "y" * 100}
    section = {"added": [], "removed": [], "changed": ["c"], "fields": {"c": [field]}}
    text = shown({"dry_run": True, "applied": False, "version": None, "diff": {"pc": section}})
    line = text.splitlines()[-1]
    assert line.startswith('      description: "[bold]x[/bold]" → "yyy')
    assert line.endswith("…") and len(line.split(" → ")[1]) == 60
    # an older server's answer without ``fields`` still renders
    del section["fields"]
    assert "~ pc: c" in shown(
        {"dry_run": True, "applied": False, "version": None, "diff": {"pc": section}}
    )
