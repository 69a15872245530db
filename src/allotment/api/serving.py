"""Serving an app on a thread of this process: for tests, benchmarks and embedding."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((LOCALHOST, 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve_in_thread(app: FastAPI, *, timeout: float = 20.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free port of 127.0.0.1 until the block ends;
    yields the base URL. Raises ``RuntimeError`` when it does not start in ``timeout``."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host=LOCALHOST, port=port, log_level="critical", access_log=False)
    )
    thread = threading.Thread(target=server.run, name="allotment-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{LOCALHOST}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout)
