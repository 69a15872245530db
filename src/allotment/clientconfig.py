"""Where the CLI finds the server: ``ALLOT_URL`` / ``ALLOT_TOKEN``, else the config file.

The file is ``$XDG_CONFIG_HOME/allotment/config.json`` (``~/.config/allotment/config.json``
when ``XDG_CONFIG_HOME`` is unset), a JSON object ``{"url": ..., "token": ...}`` that
``allot up`` writes with :func:`write_client_config`. ``token`` may be null or absent.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from allotment.domain.errors import InvalidInput

ENV_URL = "ALLOT_URL"
ENV_TOKEN = "ALLOT_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8642"
FILE_NAME = "config.json"


def config_path() -> Path:
    """The config file this user's CLI reads."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "allotment" / FILE_NAME


def read_client_config(path: Path | None = None) -> dict[str, str | None]:
    """The file's ``url`` and ``token`` (empty when there is no file); raises
    ``InvalidInput`` for a file that is not such a JSON object."""
    path = path or config_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(
            f"cannot read the client config {path}: {exc}", fields={"path": str(path)}
        ) from exc
    if not isinstance(data, dict):
        raise InvalidInput(
            f"the client config {path} is not a JSON object", fields={"path": str(path)}
        )
    out: dict[str, str | None] = {}
    for key in ("url", "token"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidInput(
                f"the client config {path}: {key!r} must be a string", fields={"path": str(path)}
            )
        out[key] = value
    return out


def load_client_config(path: Path | None = None) -> tuple[str, str | None]:
    """``(url, token)``: each from its environment variable when set, else from the
    config file, else the default URL and no token. The file's token is used only with
    the file's URL (a token for another server is not sent)."""
    stored = read_client_config(path)
    env_url = os.environ.get(ENV_URL) or None
    env_token = os.environ.get(ENV_TOKEN) or None
    url = env_url or stored.get("url") or DEFAULT_URL
    token = env_token
    if token is None and (env_url is None or env_url == stored.get("url")):
        token = stored.get("token")
    return url, token


def write_client_config(url: str, token: str | None, path: Path | None = None) -> Path:
    """Write ``{"url", "token"}`` for this user (readable by the owner only); returns
    the path written."""
    target = path or config_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".config-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump({"url": url, "token": token}, file, indent=2)
            file.write("\n")
        Path(temp).chmod(0o600)
        Path(temp).replace(target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target
