"""Where a tenant's alerts go: the ``webhook`` of a tenant in ``cluster.yaml``."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Webhook(BaseModel):
    """Where a tenant's alerts are POSTed as JSON (``http`` or ``https`` only); with a
    ``secret``, each body is signed (HMAC-SHA256, header ``X-Allotment-Signature``)."""

    url: Annotated[str, Field(min_length=1, max_length=2048)]
    secret: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"webhook url {value!r} must be an http:// or https:// URL with a host"
            )
        return value
