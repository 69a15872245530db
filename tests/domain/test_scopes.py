"""Mount sources against data scopes: resolution first, then whole-component prefixes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allotment.domain.job import Mount
from allotment.domain.scopes import check_mounts, resolve_source, within

ROOT = "/allot-test-nonexistent"
SCOPES = [f"{ROOT}/data/vision", f"{ROOT}/scratch/vision/", "s3://vision-bucket/train"]


def refused(*sources: str, scopes: list[str] = SCOPES) -> list[str]:
    mounts = [Mount(source=s, target="/mnt") for s in sources]
    return [i.path for i in check_mounts(mounts, scopes, tenant="vision")]


@pytest.mark.parametrize(
    "source",
    [
        f"{ROOT}/data/vision",
        f"{ROOT}/data/vision/",
        f"{ROOT}/data/vision/imagenet/train",
        f"{ROOT}//data///vision//imagenet",
        f"{ROOT}/data/vision/./a/../b",
        f"{ROOT}/data/other/../vision/x",
        f"{ROOT}/scratch/vision",
        "s3://vision-bucket/train/shard-0",
        "S3://vision-bucket/train/",
    ],
)
def test_inside_a_scope_is_allowed(source: str) -> None:
    assert refused(source) == []


@pytest.mark.parametrize(
    "source",
    [
        f"{ROOT}/data/other-tenant",
        f"{ROOT}/data/vision2",
        f"{ROOT}/data/vision-private/x",
        f"{ROOT}/data/vision/../other",
        f"{ROOT}/data/vision/../../etc",
        f"{ROOT}/data",
        "/",
        "/etc/passwd",
        "data/vision",
        "./data/vision",
        "s3://vision-bucket/train2",
        "s3://vision-bucket/train/../eval",
        "s3://other-bucket/train",
        "gs://vision-bucket/train",
        "file:///allot-test-nonexistent/data/vision",
    ],
)
def test_outside_every_scope_is_refused(source: str) -> None:
    assert refused(source) == ["mounts.0.source"]


def test_the_message_names_the_path_the_tenant_and_its_scopes() -> None:
    mounts = [Mount(source=f"{ROOT}/data/mine/../other", target="/mnt")]
    (issue,) = check_mounts(mounts, [f"{ROOT}/data/mine"], tenant="vision")
    assert f"{ROOT}/data/mine/../other" in issue.message
    assert f"resolves to '{ROOT}/data/other'" in issue.message
    assert "'vision'" in issue.message and f"{ROOT}/data/mine" in issue.message


def test_a_tenant_without_scopes_may_mount_nothing() -> None:
    (issue,) = check_mounts([Mount(source="/data", target="/d")], [], tenant="t")
    assert "declares no data scopes" in issue.message


def test_each_bad_mount_is_named() -> None:
    assert refused(f"{ROOT}/data/vision/a", "/etc", f"{ROOT}/data/vision2") == [
        "mounts.1.source",
        "mounts.2.source",
    ]


def test_a_null_byte_is_refused_not_raised() -> None:
    assert resolve_source("/data/\x00vision") is None
    assert refused(f"{ROOT}/data/vision/\x00") == ["mounts.0.source"]


def test_symlinks_are_followed(tmp_path: Path) -> None:
    scope = tmp_path / "data" / "vision"
    other = tmp_path / "data" / "other"
    scope.mkdir(parents=True)
    other.mkdir(parents=True)
    (scope / "escape").symlink_to(other)
    (tmp_path / "alias").symlink_to(scope)
    scopes = [str(scope)]
    assert refused(str(scope / "escape"), scopes=scopes) == ["mounts.0.source"]
    assert refused(str(scope / "escape" / "file"), scopes=scopes) == ["mounts.0.source"]
    assert refused(str(tmp_path / "alias" / "x"), scopes=scopes) == []
    # a scope given through a link is resolved too
    assert refused(str(scope / "x"), scopes=[str(tmp_path / "alias")]) == []


def test_within_compares_whole_components() -> None:
    assert within("/data/vision/x", "/data/vision")
    assert not within("/data/vision2", "/data/vision")
    assert within("/anything", "/")


# ---------------------------------------------------------------- properties

PARTS = st.sampled_from(["data", "vision", "vision2", "mine", "other", "..", ".", "", "x"])


def reference(path: str) -> list[str]:
    """Resolve without links (none exist under ROOT): a stack of components."""
    stack: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if stack:
                stack.pop()
        else:
            stack.append(part)
    return stack


paths = st.lists(PARTS, min_size=0, max_size=8).map(lambda parts: ROOT + "/" + "/".join(parts))
scope_sets = st.lists(
    st.lists(st.sampled_from(["data", "vision", "vision2", "mine"]), min_size=1, max_size=3).map(
        lambda parts: ROOT + "/" + "/".join(parts)
    ),
    min_size=0,
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(source=paths, scopes=scope_sets, trailing=st.booleans())
def test_accepted_exactly_when_the_resolved_path_is_inside_a_scope(
    source: str, scopes: list[str], trailing: bool
) -> None:
    assert not os.path.lexists(ROOT)
    if trailing:
        source += "/"
    accepted = refused(source, scopes=scopes) == []
    resolved = reference(source)
    inside = any(resolved[: len(reference(s))] == reference(s) for s in scopes)
    assert accepted == inside, (source, scopes, resolved)


@settings(max_examples=300, deadline=None)
@given(source=st.text(max_size=40), scopes=scope_sets)
def test_arbitrary_text_never_raises_and_never_escapes(source: str, scopes: list[str]) -> None:
    if not source:
        return
    issues = check_mounts([Mount(source=source, target="/t")], scopes, tenant="t")
    if not issues:
        resolved = resolve_source(source)
        assert resolved is not None
        assert any(within(resolved, s) for s in scopes)
