"""The work layout: per-tenant roots, safe segments, private directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from allotment.store.layout import log_path, logs_dir, make_private, tenant_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_paths_are_per_tenant(tmp_path: Path) -> None:
    path = log_path(tmp_path, "vision", "j-1", 2, "worker", 0, "err")
    assert path == tmp_path / "vision" / "j-1" / "2" / "logs" / "worker-0.err"
    assert path.parent == logs_dir(tmp_path, "vision", "j-1", 2)


def test_names_cannot_step_out(tmp_path: Path) -> None:
    assert tenant_dir(tmp_path, "..").parent == tmp_path
    assert tenant_dir(tmp_path, "a/../../b").parent == tmp_path
    path = log_path(tmp_path, "..", "../x", 1, "../w", 0, "out")
    assert path.resolve().is_relative_to(tmp_path.resolve())
    assert len(path.relative_to(tmp_path).parts) == 5


def test_make_private_creates_every_level_0700(tmp_path: Path) -> None:
    root = tmp_path / "work"
    logs = logs_dir(root, "vision", "j-1", 1)
    make_private(root, logs)
    for directory in (root, root / "vision", root / "vision" / "j-1", logs.parent, logs):
        assert mode(directory) == 0o700, directory
    make_private(root, logs)  # idempotent


def test_make_private_creates_the_missing_levels_0700_whatever_the_umask(
    tmp_path: Path,
) -> None:
    root = tmp_path / "work"
    make_private(root, logs_dir(root, "vision", "j-1", 1))
    logs = logs_dir(root, "vision", "j-1", 2)
    old = os.umask(0o277)  # mkdir alone would leave 0o500
    try:
        make_private(root, logs)
    finally:
        os.umask(old)
    for directory in (root, root / "vision", root / "vision" / "j-1", logs.parent, logs):
        assert mode(directory) == 0o700, directory
