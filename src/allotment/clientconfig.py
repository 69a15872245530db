"""Where the CLI finds the server and its token.

``ALLOT_URL`` and ``ALLOT_TOKEN`` win; else the JSON file that ``allot up`` writes for
the local user: ``$XDG_CONFIG_HOME/allotment/config.json`` (``~/.config/...`` without
``XDG_CONFIG_HOME``), ``{"url": ..., "token": ...}``, readable by its owner only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8642"


def client_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "allotment" / "config.json"


def write_client_config(url: str, token: str | None, path: Path | None = None) -> Path:
    """Write the config atomically with mode 0600; return its path."""
    target = path or client_config_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(target.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": url, "token": token}, out)
        out.write("\n")
    temp.replace(target)
    return target


def read_client_config(path: Path | None = None) -> dict[str, str]:
    """The file's ``url`` and ``token`` (missing keys absent; no file: empty)."""
    source = path or client_config_path()
    try:
        data = json.loads(source.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: str(v) for k, v in data.items() if k in ("url", "token") and v}


def load_client_config(path: Path | None = None) -> tuple[str, str | None]:
    """The server URL and token the CLI should use."""
    stored = read_client_config(path)
    url = os.environ.get("ALLOT_URL") or stored.get("url") or DEFAULT_URL
    token = os.environ.get("ALLOT_TOKEN") or stored.get("token")
    return url, token
