"""A cap on request bodies: larger ones get 413 with the usual JSON error body."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1024 * 1024


async def send_error(
    send: Send,
    status: int,
    code: str,
    message: str,
    fields: dict[str, Any],
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with the usual JSON error body from ASGI middleware, and close."""
    body = json.dumps({"code": code, "message": message, "fields": fields}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: refuse a body over ``max_bytes``, by ``Content-Length`` up front
    or, for a streamed body, as soon as the bytes read pass the cap."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Send) -> None:
        await send_error(
            send,
            413,
            "body_too_large",
            f"request body larger than {self.max_bytes} bytes",
            {"max_bytes": self.max_bytes},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        # Read the body here so that a streamed one is capped too, then replay it.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RefuseNul:
    """ASGI middleware: refuse (400, ``invalid_request``) a path or query string holding
    a NUL character, which no name holds and PostgreSQL cannot even compare."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = str(scope.get("path", ""))
            query = bytes(scope.get("query_string", b"")).lower()
            if "\x00" in path or b"%00" in query or b"\x00" in query:
                await send_error(
                    send,
                    400,
                    "invalid_request",
                    "the request's path or query holds a NUL character (%00)",
                    {},
                )
                return
        await self.app(scope, receive, send)
