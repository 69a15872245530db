"""A job is checked again at launch: what passed at submit may not pass any more (a
link now leads elsewhere, a tenant's allow-list shrank), and then nothing runs."""

from __future__ import annotations

from pathlib import Path

from allotment.control.launch import container_spec
from allotment.domain.job import JobSpec
from allotment.domain.lifecycle import FailureClass
from allotment.domain.loading import load_cluster_text

CLUSTER = """
pools: [{{name: local}}]
nodes: [{{name: box, pool: local, capacity: {{gpu: 1, cpu: 4, memory: 8Gi}}}}]
tenants:
  - {{name: alpha, data_scopes: ["{data}/alpha"], images: [{images}]}}
queues:
  - {{name: q, tenant: alpha}}
executor:
  runtime: {{kind: podman}}
"""


def spec(source: Path, image: str = "localhost/team/train:1") -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "queue": "q",
            "replicas": [{"count": 1}],
            "command": ["true"],
            "image": image,
            "mounts": [{"source": str(source), "target": "/data"}],
        }
    )


def test_a_mount_whose_link_now_leads_outside_the_scope_fails_at_launch(tmp_path: Path) -> None:
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    (alpha / "set").mkdir(parents=True)
    beta.mkdir()
    cluster = load_cluster_text(CLUSTER.format(data=tmp_path, images="localhost/team/*"))
    job = spec(alpha / "set")
    container, refused = container_spec(cluster, job, "alpha")
    assert refused is None and container is not None
    assert container.binds[0].source == str(alpha / "set")
    # After submit, the directory is swapped for a link to another tenant's data.
    (alpha / "set").rmdir()
    (alpha / "set").symlink_to(beta)
    container, refused = container_spec(cluster, job, "alpha")
    assert container is None and refused is not None
    assert refused.failure is FailureClass.DATA_ACCESS
    assert "outside tenant 'alpha'" in refused.message


def test_an_image_no_longer_allowed_fails_at_launch_with_class_image(tmp_path: Path) -> None:
    (tmp_path / "alpha").mkdir()
    before = load_cluster_text(CLUSTER.format(data=tmp_path, images="localhost/team/*"))
    after = load_cluster_text(CLUSTER.format(data=tmp_path, images="localhost/other/*"))
    job = spec(tmp_path / "alpha")
    assert container_spec(before, job, "alpha")[1] is None
    container, refused = container_spec(after, job, "alpha")
    assert container is None and refused is not None
    assert refused.failure is FailureClass.IMAGE
    assert "localhost/other/*" in refused.message
