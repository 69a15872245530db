"""The container parts of ``cluster.yaml``: ``executor.runtime``, a tenant's ``images``,
``uid`` and ``data_scopes``, uid collisions, derived uids."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.domain.cluster import Cluster
from allotment.domain.errors import ConfigError
from allotment.domain.executor import RuntimeSpec, UidRange
from allotment.domain.loading import load_cluster_text
from allotment.domain.tenancy import DataScope, derived_uid

BODY = """
pools: [{name: p}]
nodes: [{name: n, pool: p, capacity: {gpu: 1, cpu: 4, memory: 8Gi}}]
queues: [{name: q, tenant: a}]
"""


def load(executor: str = "", tenants: str = "tenants: [{name: a}]") -> Cluster:
    return load_cluster_text(f"{executor}\n{tenants}\n{BODY}", source="cluster.yaml")


def issues(executor: str = "", tenants: str = "tenants: [{name: a}]") -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        load(executor, tenants)
    return [(i.path, i.message) for i in caught.value.issues]


def test_the_default_runtime_is_plain_processes() -> None:
    runtime = load().runtime
    assert runtime == RuntimeSpec()
    assert runtime.kind == "process" and not runtime.containers
    assert runtime.shm == 64 << 20 and runtime.pull == "missing"
    assert runtime.uids == UidRange(first=100_000, count=65_536)


def test_the_runtime_section_parses() -> None:
    runtime = load(
        """
executor:
  runtime:
    kind: podman
    podman: /usr/local/bin/podman
    oci_runtime: runc
    default_image: registry.example.com/base:1
    pull: never
    uids: {first: 200000, count: 1000}
    device_dir: /run/fake-dev
    gpu_devices: cdi
    shm: 64Mi
"""
    ).runtime
    assert runtime.containers and runtime.kind == "podman"
    assert runtime.podman == "/usr/local/bin/podman" and runtime.oci_runtime == "runc"
    assert runtime.default_image == "registry.example.com/base:1"
    assert runtime.pull == "never"
    assert runtime.uids == UidRange(first=200_000, count=1000)
    assert runtime.device_dir == "/run/fake-dev" and runtime.gpu_devices == "cdi"
    assert runtime.shm == 64 * 1024 * 1024


@pytest.mark.parametrize(("written", "size"), [("1Gi", 1 << 30), ("2097152", 2 << 20)])
def test_shm_takes_sizes_as_people_write_them(written: str, size: int) -> None:
    assert load(f"executor: {{runtime: {{kind: podman, shm: '{written}'}}}}").runtime.shm == size


@pytest.mark.parametrize(
    ("runtime", "path"),
    [
        ("{kind: docker}", "executor.runtime.kind"),
        ("{kind: podman, shm: 1Ki}", "executor.runtime.shm"),
        ("{kind: podman, default_image: '--privileged'}", "executor.runtime.default_image"),
        ("{kind: podman, pull: always}", "executor.runtime.pull"),
        ("{kind: podman, device_dir: dev}", "executor.runtime.device_dir"),
        ("{kind: podman, uids: {first: 999}}", "executor.runtime.uids.first"),
        ("{kind: podman, uids: {first: 2147483000, count: 1000}}", "executor.runtime.uids"),
        ("{kind: podman, gpus: all}", "executor.runtime.gpus"),
    ],
)
def test_bad_runtime_settings_name_their_key(runtime: str, path: str) -> None:
    assert path in [p for p, _ in issues(f"executor: {{runtime: {runtime}}}")]


def test_slurm_takes_either_runtime() -> None:
    # The Slurm launcher runs each replica through the same runtime on its node.
    text = """
executor:
  kind: slurm
  slurm: {partition: gpu, pools: {p: {partition: gpu}}}
  runtime: {kind: %s}
pools: [{name: p}]
tenants: [{name: a}]
queues: [{name: q, tenant: a}]
"""
    assert load_cluster_text(text % "podman").runtime.containers
    assert not load_cluster_text(text % "process").runtime.containers


def test_tenant_images_uid_and_data_scopes() -> None:
    cluster = load(
        "executor: {runtime: {kind: podman, default_image: 'registry.example.com/base:1'}}",
        """
tenants:
  - name: a
    uid: 5000
    images: [registry.example.com/a/*, "registry.example.com/tools:1.?"]
    data_scopes:
      - /data/a
      - {path: /scratch/a, writable: true}
      - {path: "s3://a-bucket/x"}
  - name: b
""",
    )
    a = cluster.tenants["a"]
    assert a.uid == 5000
    assert a.images == ["registry.example.com/a/*", "registry.example.com/tools:1.?"]
    assert a.data_scopes == [
        DataScope(path="/data/a", writable=False),
        DataScope(path="/scratch/a", writable=True),
        DataScope(path="s3://a-bucket/x", writable=False),
    ]
    assert cluster.uid_of("a") == 5000
    assert cluster.uid_of("b") == derived_uid("b", cluster.runtime)
    assert cluster.uid_of("unknown") == derived_uid("unknown", cluster.runtime)
    assert cluster.images_of("a") == [
        "registry.example.com/base:1",
        "registry.example.com/a/*",
        "registry.example.com/tools:1.?",
    ]
    assert cluster.images_of("b") == ["registry.example.com/base:1"]
    assert cluster.images_of("unknown") == ["registry.example.com/base:1"]


def test_without_a_default_image_a_tenant_has_only_its_own() -> None:
    cluster = load("", "tenants: [{name: a, images: [x/y]}]")
    assert cluster.images_of("a") == ["x/y"]
    assert cluster.images_of("other") == []


@pytest.mark.parametrize(
    ("tenant", "path"),
    [
        ("{name: a, uid: 999}", "tenants.0.uid"),
        ("{name: a, uid: 0}", "tenants.0.uid"),
        ("{name: a, images: ['a b']}", "tenants.0.images.0"),
        ("{name: a, images: ['']}", "tenants.0.images.0"),
        ("{name: a, data_scopes: ['']}", "tenants.0.data_scopes.0.path"),
        ("{name: a, data_scopes: [{path: /x, writeable: true}]}", "tenants.0.data_scopes.0"),
    ],
)
def test_bad_tenant_settings_name_their_key(tenant: str, path: str) -> None:
    found = [p for p, _ in issues("", f"tenants: [{tenant}]")]
    assert any(p.startswith(path) for p in found), found


TWO_WITH_UID = "tenants: [{name: a, uid: 5000}, {name: b, uid: 5000}]"


def test_a_shared_uid_is_refused_when_containers_are_on() -> None:
    [(path, message)] = issues("executor: {runtime: {kind: podman}}", TWO_WITH_UID)
    assert path == "tenants.1.uid"
    assert "'b'" in message and "'a'" in message and "5000" in message


def test_a_shared_uid_is_no_matter_with_plain_processes() -> None:
    cluster = load("", TWO_WITH_UID)
    assert cluster.uid_of("a") == cluster.uid_of("b") == 5000


def test_an_explicit_uid_may_not_be_another_tenants_derived_one() -> None:
    runtime = RuntimeSpec(kind="podman")
    taken = derived_uid("a", runtime)
    tenants = f"tenants: [{{name: a}}, {{name: b, uid: {taken}}}]"
    [(path, message)] = issues("executor: {runtime: {kind: podman}}", tenants)
    assert path == "tenants.1.uid" and str(taken) in message
    load(
        "executor: {runtime: {kind: podman}}",
        f"tenants: [{{name: a}}, {{name: b, uid: {taken + 1}}}]",
    )


def test_derived_uids_collide_only_as_reported() -> None:
    # With a one-uid range every tenant derives the same uid, the one the jobs of
    # queues without a tenant ("default") run under: a and b are both reported.
    found = issues(
        "executor: {runtime: {kind: podman, uids: {first: 70000, count: 1}}}",
        "tenants: [{name: a}, {name: b}, {name: c, uid: 80000}]",
    )
    assert [p for p, _ in found] == ["tenants.0.uid", "tenants.1.uid"]
    assert "default" in found[0][1]


def test_a_tenant_may_not_share_the_uid_of_queues_without_a_tenant() -> None:
    runtime = RuntimeSpec(kind="podman")
    taken = derived_uid("default", runtime)
    [(path, message)] = issues(
        "executor: {runtime: {kind: podman}}", f"tenants: [{{name: a, uid: {taken}}}]"
    )
    assert path == "tenants.0.uid" and "default" in message
    # A declared tenant named default is the one those jobs run as: no extra owner.
    load("executor: {runtime: {kind: podman}}", "tenants: [{name: default}, {name: a}]")


def test_derived_uid_is_the_documented_hash() -> None:
    runtime = RuntimeSpec(uids=UidRange(first=100_000, count=65_536))
    assert derived_uid("vision", runtime) == 100_000 + zlib.crc32(b"vision") % 65_536


@settings(max_examples=300, deadline=None)
@given(
    st.text(min_size=1, max_size=64),
    st.integers(min_value=1000, max_value=2**31 - 2 - 2**24),
    st.integers(min_value=1, max_value=2**24),
)
def test_derived_uid_is_stable_and_in_range(name: str, first: int, count: int) -> None:
    runtime = RuntimeSpec(uids=UidRange(first=first, count=count))
    uid = derived_uid(name, runtime)
    assert first <= uid < first + count
    assert derived_uid(name, RuntimeSpec(uids=UidRange(first=first, count=count))) == uid
