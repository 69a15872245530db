"""Image allow-lists (:func:`image_matches`, :func:`image_allowed`) and the checks of
what a job may run on the cluster's runtime (:func:`check_execution`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.domain.cluster import Cluster
from allotment.domain.errors import ConfigError
from allotment.domain.isolation import (
    ImageNotAllowed,
    check_execution,
    image_allowed,
    image_matches,
    job_image,
)
from allotment.domain.job import JobSpec
from allotment.domain.loading import load_cluster_text

DIGEST = "@sha256:" + "0123456789abcdef" * 4

# ---------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("image", "pattern", "expected"),
    [
        # exact references
        ("registry/team/train:1.4", "registry/team/train:1.4", True),
        ("registry/team/train:1.5", "registry/team/train:1.4", False),
        ("registry/team/train", "registry/team/train", True),
        ("registry/team/train" + DIGEST, "registry/team/train" + DIGEST, True),
        # a repository without a tag admits its tags and digests, and nothing else
        ("registry/team/train:1.4", "registry/team/train", True),
        ("registry/team/train" + DIGEST, "registry/team/train", True),
        ("registry/team/train:1.4" + DIGEST, "registry/team/train", True),
        ("registry/team/trainer:1", "registry/team/train", False),
        ("registry/team/train2", "registry/team/train", False),
        ("registry/team/train/sub:1", "registry/team/train", False),
        ("other/team/train:1", "registry/team/train", False),
        ("localhost:5000/team/train:1", "localhost:5000/team/train", True),
        # a tag given means exactly that tag
        ("registry/team/train:1.40", "registry/team/train:1.4", False),
        ("registry/team/train:1.4.1", "registry/team/train:1.4", False),
        ("registry/team/train", "registry/team/train:1.4", False),
        ("registry/team/train:1.4", "registry/team/train" + DIGEST, False),
        # * patterns (* crosses /)
        ("registry/team/train:1", "registry/team/*", True),
        ("registry/team/sub/train:1", "registry/team/*", True),
        ("registry/teamx/train:1", "registry/team/*", False),
        ("registry/team", "registry/team/*", False),
        ("registry/team/train:1", "registry/*/train:1", True),
        ("registry/team/train:2", "registry/*/train:1", False),
        ("registry/team/train:1.4", "registry/team/train:1.*", True),
        ("registry/team/train:2.0", "registry/team/train:1.*", False),
        ("registry/team/train:1", "registry/team/trai?", True),
        ("anything/at:all", "*", True),
        # a one-word repository is not a registry host with a port
        ("pytorch:2.3", "pytorch", True),
        ("pytorch:5000/evil/image", "pytorch", False),
        ("pytorch:5000/evil/image:1", "pytorch", False),
        ("pytorch:5000/evil/image" + DIGEST, "pytorch", False),
    ],
)
def test_image_matches(image: str, pattern: str, expected: bool) -> None:
    assert image_matches(image, pattern) is expected


def test_image_allowed_is_any_pattern() -> None:
    patterns = ["registry/base:1", "registry/team/*"]
    assert image_allowed("registry/base:1", patterns)
    assert image_allowed("registry/team/x:3", patterns)
    assert not image_allowed("registry/base:2", patterns)
    assert not image_allowed("registry/base:1", [])


# A small vocabulary, so that random references often share hosts, paths and tags.
HOSTS = ["registry.example.com", "registry.example.com:5000", "localhost", "train", "train:5000"]
WORDS = ["team", "teamx", "train", "vision", "a"]
TAGS = ["1", "1.4", "latest", "5000", "train"]


@st.composite
def references(draw: st.DrawFn) -> str:
    """An image reference: ``[host/]path[:tag][@digest]``."""
    parts = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
    host = draw(st.one_of(st.none(), st.sampled_from(HOSTS)))
    name = "/".join(([host] if host else []) + parts)
    tag = draw(st.one_of(st.none(), st.sampled_from(TAGS)))
    digest = draw(st.booleans())
    return name + (f":{tag}" if tag else "") + (DIGEST if digest else "")


def repository(image: str) -> str:
    """``image`` without its tag and digest (the tag is after the last ``/``)."""
    name = image.split("@", 1)[0]
    head, slash, last = name.rpartition("/")
    return head + slash + last.split(":", 1)[0]


def literal_allows(image: str, pattern: str) -> bool:
    """The rule for a pattern without wildcards, written independently: the same
    reference; or, for a pattern naming no tag or digest, a tag or digest of it."""
    if image == pattern:
        return True
    names_version = "@" in pattern or ":" in pattern.rsplit("/", 1)[-1]
    return not names_version and repository(image) == pattern


@settings(max_examples=400, deadline=None)
@given(references(), st.lists(references(), max_size=4))
def test_an_image_is_allowed_by_literal_patterns_only_as_the_rule_says(
    image: str, patterns: list[str]
) -> None:
    expected = any(literal_allows(image, p) for p in patterns)
    assert image_allowed(image, patterns) is expected


@settings(max_examples=300, deadline=None)
@given(references(), st.sampled_from(HOSTS), st.sampled_from(WORDS))
def test_a_star_pattern_admits_only_what_lies_below_its_prefix(
    image: str, host: str, team: str
) -> None:
    prefix = f"{host}/{team}/"
    if image_matches(image, prefix + "*"):
        assert image.startswith(prefix)


# ---------------------------------------------------------------- check_execution

BASE = "registry.example.com/base:1"


def cluster(
    runtime: str = "kind: podman", *, tenant_images: str = '["registry/vision/*"]'
) -> Cluster:
    return load_cluster_text(
        f"""
executor:
  runtime: {{{runtime}}}
pools: [{{name: p}}]
nodes: [{{name: n, pool: p, capacity: {{gpu: 1, cpu: 4, memory: 8Gi}}}}]
tenants:
  - {{name: vision, images: {tenant_images}, data_scopes: [/data/vision]}}
  - {{name: bare}}
queues:
  - name: root
    children:
      - {{name: closed, tenant: vision}}
      - {{name: open, tenant: vision, network: true}}
      - {{name: bare-q, tenant: bare}}
""",
        source="cluster",
    )


def job(**fields: object) -> JobSpec:
    spec: dict[str, object] = {
        "name": "t",
        "queue": "closed",
        "replicas": [{"count": 1}],
        "command": ["run"],
    }
    spec.update(fields)
    return JobSpec.model_validate(spec)


def check(c: Cluster, spec: JobSpec, tenant: str = "vision") -> None:
    check_execution(spec, c, c.queues[spec.queue], tenant, source="spec")


def test_plain_processes_refuse_an_image() -> None:
    with pytest.raises(ConfigError) as caught:
        check(cluster("kind: process"), job(image="registry/vision/train:1"))
    assert not isinstance(caught.value, ImageNotAllowed)
    [issue] = caught.value.issues
    assert issue.path == "image"
    assert "plain processes" in issue.message and "runtime kind: podman" in issue.message
    assert caught.value.source == "spec"


def test_plain_processes_refuse_mounts_and_name_every_problem() -> None:
    spec = job(image="x", mounts=[{"source": "/data/vision", "target": "/data"}], network=True)
    with pytest.raises(ConfigError) as caught:
        check(cluster("kind: process"), spec)
    assert [i.path for i in caught.value.issues] == ["image", "mounts", "network"]
    assert "cannot mount anything" in caught.value.issues[1].message


def test_plain_processes_run_a_job_without_image_or_mounts() -> None:
    check(cluster("kind: process"), job())
    check(cluster("kind: process"), job(queue="open", network=True))


def test_containers_need_an_image_when_there_is_no_default() -> None:
    with pytest.raises(ConfigError) as caught:
        check(cluster(), job())
    assert not isinstance(caught.value, ImageNotAllowed)
    [issue] = caught.value.issues
    assert issue.path == "image" and "no default image" in issue.message
    assert "may use: registry/vision/*" in issue.message
    with pytest.raises(ConfigError, match="may use: none"):
        check(cluster(), job(queue="bare-q"), "bare")


def test_the_default_image_is_everyones() -> None:
    c = cluster(f'kind: podman, default_image: "{BASE}"')
    check(c, job())
    check(c, job(queue="bare-q"), "bare")
    check(c, job(image=BASE), "bare")
    assert job_image(job(), c) == BASE
    assert job_image(job(image="registry/vision/x:1"), c) == "registry/vision/x:1"


def test_an_image_outside_the_allow_list_is_refused_with_the_list() -> None:
    c = cluster(f'kind: podman, default_image: "{BASE}"')
    with pytest.raises(ImageNotAllowed) as caught:
        check(c, job(image="registry/nlp/secret:1"))
    error = caught.value
    assert isinstance(error, ConfigError) and error.code == "image_not_allowed"
    [issue] = error.issues
    assert issue.path == "image"
    assert "'registry/nlp/secret:1'" in issue.message
    assert f"allowed: {BASE}, registry/vision/*" in issue.message
    assert error.fields["tenant"] == "vision"
    assert error.fields["allowed"] == [BASE, "registry/vision/*"]
    with pytest.raises(ImageNotAllowed, match=f"allowed: {BASE}$"):
        check(c, job(queue="bare-q", image="registry/vision/x:1"), "bare")


def test_an_image_inside_the_allow_list_runs() -> None:
    check(cluster(), job(image="registry/vision/train:2"))
    check(cluster(), job(image="registry/vision/deep/train" + DIGEST))


def test_the_network_needs_a_queue_that_allows_it() -> None:
    c = cluster(f'kind: podman, default_image: "{BASE}"')
    with pytest.raises(ConfigError) as caught:
        check(c, job(network=True))
    [issue] = caught.value.issues
    assert issue.path == "network"
    assert "queue 'closed' does not allow the network" in issue.message
    check(c, job(queue="open", network=True))
    check(c, job(queue="closed", network=False))


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "key\n"])
def test_containers_refuse_env_values_with_line_breaks(value: str) -> None:
    # Such a value could only reach the container through Podman's own environment,
    # where a job would set LD_PRELOAD or CONTAINERS_CONF of a root process.
    c = cluster(f'kind: podman, default_image: "{BASE}"')
    with pytest.raises(ConfigError) as caught:
        check(c, job(env={"OK": "plain", "LD_PRELOAD": value}))
    [issue] = caught.value.issues
    assert issue.path == "env.LD_PRELOAD" and "line break" in issue.message
    check(c, job(env={"OK": "plain text with spaces = and 'quotes'"}))
    check(cluster("kind: process"), job(env={"MULTI": value}))  # a process gets it as is


@pytest.mark.parametrize(
    "image",
    ["--privileged", "--volume=/:/host", "Registry/Team/train", "a b", "train:tag with space", ""],
)
def test_a_job_image_must_be_an_image_reference(image: str) -> None:
    with pytest.raises(ValueError, match="not an image reference"):
        job(image=image)


@pytest.mark.parametrize(
    "image",
    [
        "pytorch",
        "pytorch:2.3",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "localhost:5000/team/train:1.4" + DIGEST,
        "registry.example.com/a__b/c-d.e:V1_x",
    ],
)
def test_image_references_are_accepted(image: str) -> None:
    assert job(image=image).image == image
