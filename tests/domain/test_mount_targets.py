"""Where a mount may go inside a container (:class:`Mount` targets), and which mounts a
tenant's data scopes allow, read-only or writable (:func:`resolve_mounts`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from allotment.domain.job import Mount
from allotment.domain.scopes import resolve_mounts
from allotment.domain.tenancy import DataScope

ROOT = "/allot-test-nonexistent"


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("data", "absolute"),
        ("relative/dir", "absolute"),
        ("", "at least 1 character"),
        ("/data/../etc", ". or .."),
        ("/data/./x", ". or .."),
        ("/..", ". or .."),
        ("/", "must not be /"),
        ("//", "must not be /"),
        ("/proc", "reserved"),
        ("/proc/sys/kernel", "reserved"),
        ("//proc//self", "reserved"),
        ("/sys", "reserved"),
        ("/dev", "reserved"),
        ("/dev/shm", "reserved"),
        ("/allotment", "reserved"),
        ("/allotment/work", "reserved"),
        ("/allotment/work/x/", "reserved"),
        ("/data,readonly=false", "commas"),
        ('/data"x', "double quotes"),
        ("/data\n/x", "newlines"),
        ("/data\r", "newlines"),
    ],
)
def test_bad_targets_are_refused(target: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Mount(source="/data/x", target=target)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "target", ["/data", "/data/", "/mnt/in/0", "/proc2", "/devices", "/allotmentx", "/a/b.c/..d"]
)
def test_good_targets_are_kept(target: str) -> None:
    assert Mount(source="/data/x", target=target).target == target


def test_mounts_are_read_only_unless_asked() -> None:
    assert Mount(source="/d", target="/d").read_only is True
    assert Mount(source="/d", target="/d", read_only=False).read_only is False


SCOPES: list[DataScope | str] = [
    f"{ROOT}/data/vision",
    DataScope(path=f"{ROOT}/scratch/vision", writable=True),
    DataScope(path=f"{ROOT}/scratch/vision/frozen"),
]


def resolved(*mounts: Mount) -> tuple[list[tuple[str, Mount]], list[tuple[str, str]]]:
    allowed, issues = resolve_mounts(list(mounts), SCOPES, tenant="vision")
    return allowed, [(i.path, i.message) for i in issues]


def test_a_read_only_scope_refuses_writing() -> None:
    mount = Mount(source=f"{ROOT}/data/vision/set", target="/in", read_only=False)
    allowed, issues = resolved(mount)
    assert allowed == []
    [(path, message)] = issues
    assert path == "mounts.0.read_only"
    assert "read-only data scope" in message and "read_only: true" in message
    assert resolved(Mount(source=f"{ROOT}/data/vision/set", target="/in"))[1] == []


def test_a_writable_scope_allows_writing_and_reading() -> None:
    write = Mount(source=f"{ROOT}/scratch/vision/run1", target="/out", read_only=False)
    read = Mount(source=f"{ROOT}/scratch/vision/run2", target="/in")
    allowed, issues = resolved(write, read)
    assert issues == []
    assert allowed == [
        (f"{ROOT}/scratch/vision/run1", write),
        (f"{ROOT}/scratch/vision/run2", read),
    ]


def test_a_read_only_scope_inside_a_writable_one_is_writable_through_it() -> None:
    mount = Mount(source=f"{ROOT}/scratch/vision/frozen/x", target="/x", read_only=False)
    assert resolved(mount)[1] == []


def test_string_scopes_are_read_only() -> None:
    mount = Mount(source="/data/a/x", target="/x", read_only=False)
    _, issues = resolve_mounts([mount], ["/data/a"], tenant="a")
    assert [i.path for i in issues] == ["mounts.0.read_only"]


def test_resolved_sources_are_returned_and_refusals_name_each_mount() -> None:
    good = Mount(source=f"{ROOT}//data/vision/./a/../b/", target="/b")
    outside = Mount(source=f"{ROOT}/data/vision/../nlp", target="/nlp")
    relative = Mount(source="data/vision", target="/rel")
    allowed, issues = resolved(good, outside, relative)
    assert allowed == [(f"{ROOT}/data/vision/b", good)]
    assert [p for p, _ in issues] == ["mounts.1.source", "mounts.2.source"]
    assert f"resolves to '{ROOT}/data/nlp'" in issues[0][1]
    assert "(writable)" in issues[0][1]  # the scopes are listed, writable ones marked


def test_links_are_resolved_to_what_they_lead_to(tmp_path: Path) -> None:
    scope = tmp_path / "scope"
    (scope / "real").mkdir(parents=True)
    (scope / "link").symlink_to(scope / "real")
    (tmp_path / "outside").mkdir()
    (scope / "escape").symlink_to(tmp_path / "outside")
    inside = Mount(source=str(scope / "link"), target="/in")
    escape = Mount(source=str(scope / "escape"), target="/out")
    allowed, issues = resolve_mounts([inside, escape], [str(scope)], tenant="t")
    assert allowed == [(str((scope / "real").resolve()), inside)]
    assert [i.path for i in issues] == ["mounts.1.source"]


@pytest.mark.parametrize("name", ["a,b", 'a"b'])
def test_a_comma_or_quote_in_a_resolved_source_is_refused(name: str) -> None:
    # Podman reads --mount as a CSV line: a comma would split it, a quote breaks it.
    mount = Mount(source=f"{ROOT}/data/vision/{name}", target="/in")
    allowed, issues = resolved(mount)
    assert allowed == [] and [p for p, _ in issues] == ["mounts.0.source"]
    assert "comma, double quote or newline" in issues[0][1]
