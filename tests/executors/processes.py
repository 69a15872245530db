"""Killing every process a local executor started under a state root (test teardown)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path


def kill_everything(root: Path) -> None:
    """SIGKILL every supervisor (its own group) and every replica group under ``root``."""
    for name in ("launch.json", "state.json"):
        for path in root.glob(f"*/*/*/{name}"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for field in ("supervisor_pid", "pgid"):
                pgid = data.get(field)
                if isinstance(pgid, int):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, signal.SIGKILL)
