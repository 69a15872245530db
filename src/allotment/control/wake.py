"""Messages from a server's API process to its scheduler process: UDP datagrams on
127.0.0.1.

When the control loop runs in a process of its own (``allot up --scheduler-process``),
the API cannot call the runner's ``wake()``: it sends one short datagram instead, which
never blocks and is dropped when nobody listens (the loop's tick is the safety net). A
message is one line of words, the first a secret the listener made (any other local
process's datagram is ignored), the second the message's kind:

- ``wake``: something was written; run a turn now;
- ``cluster``: a new configuration was stored; take it, then run a turn;
- ``begin SERVICE`` / ``end SERVICE``: the proxy took a request for a service / answered
  it; ``level SERVICE N``: it has N in flight now (sent every second, so that a lost
  message is corrected).

With several API processes (``allot up --api-processes N``) each sends these to the
server's relay instead (``allotment.api_processes``), ``begin``, ``end`` and ``level``
with the sending process's id as their last word, and ``alive PID`` every second; the
relay hands them on.

The local executor's supervisors send ``wake`` too, when their replica ends, to the
leading scheduler (its listener's port and secret are in the executor's state
directory; see ``LocalExecutor.wake_on_end``), whether it runs in a process of its own
or not.

The other way, to a listener of the API process whose port and secret the scheduler
process reads on its standard input:

- ``alert``: an alert was raised; deliver its webhooks now (delivery also looks every
  second, so a lost message only delays it).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAX_MESSAGE = 1024

Handler = Callable[[str, list[str]], None]
"""Called with a message's kind and its other words."""


class WakeListener:
    """Receives messages on a port of 127.0.0.1 chosen by the system, on a thread of its
    own, and hands each well-formed one to ``handler`` (whose errors are logged)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.secret = secrets.token_hex(16)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((HOST, 0))
        self._socket.settimeout(0.5)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="allotment-wake", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._socket.getsockname()[1]
        return port

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (also when it never started: a server that failed to open)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._socket.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                data = self._socket.recv(MAX_MESSAGE)
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            words = data.decode("utf-8", "replace").split()
            if len(words) < 2 or not secrets.compare_digest(words[0], self.secret):
                continue
            try:
                self.handler(words[1], words[2:])
            except Exception:
                log.exception("handling a %r message failed", words[1])


class WakeSender:
    """Sends messages to a :class:`WakeListener` at ``port`` with its ``secret``; never
    blocks, never raises (a message nobody receives is lost)."""

    def __init__(self, port: int, secret: str) -> None:
        self._address = (HOST, port)
        self._secret = secret
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def send(self, kind: str, *words: str) -> None:
        line = " ".join((self._secret, kind, *words)).encode()
        with contextlib.suppress(OSError):
            self._socket.sendto(line, self._address)

    def wake(self) -> None:
        self.send("wake")

    def close(self) -> None:
        self._socket.close()
