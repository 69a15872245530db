"""A one-file HTTP service, as a user would write one: it listens on ``$PORT``.

``GET /health`` answers ``ok``; ``GET /slow?s=0.5`` answers after that many seconds;
anything else answers JSON naming the process and what reached it. With ``CRASH=1`` in
its environment it exits 1 at once (a crashing service).
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/health":
            self._send(b"ok", "text/plain")
            return
        if url.path == "/slow":
            time.sleep(float(parse_qs(url.query).get("s", ["0.5"])[0]))
        body = {
            "pid": os.getpid(),
            "path": url.path,
            "query": url.query,
            "authorization": self.headers.get("Authorization"),
            "cookie": self.headers.get("Cookie"),
            "prefix": self.headers.get("X-Forwarded-Prefix"),
        }
        self._send(json.dumps(body).encode(), "application/json")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


if __name__ == "__main__":
    if os.environ.get("CRASH") == "1":
        sys.exit(1)
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
