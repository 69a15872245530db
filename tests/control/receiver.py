"""A real webhook receiver for the tests: ``http.server`` on a free port of 127.0.0.1,
answering each call with the next scripted status (200 once the script is used up),
or never answering at all (``hang``), and keeping every call it got."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from allotment.api.serving import LOCALHOST


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)
    hang: threading.Event = field(default_factory=threading.Event)
    """Set: take the request and never answer (until the receiver closes)."""
    calls: list[Call] = field(default_factory=list)
    closing: threading.Event = field(default_factory=threading.Event)


@contextmanager
def receiver(statuses: list[int] | None = None) -> Iterator[Receiver]:
    state: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            state.calls.append(Call(self.path, dict(self.headers.items()), body))
            if state.hang.is_set():
                state.closing.wait(30)
                return
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer((LOCALHOST, 0), Handler)
    server.daemon_threads = True
    state = Receiver(url=f"http://{LOCALHOST}:{server.server_address[1]}/hook")
    state.statuses = list(statuses or [])
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
