"""``allot up`` as a real process: a fresh data directory and client config per test,
a free port, and every process (server and replicas) killed in teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from allotment.api.serving import free_port
from allotment.client import AllotmentClient
from allotment.clientconfig import read_client_config
from tests.executors.processes import kill_everything

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Up:
    """One ``allot up`` deployment: start, stop and kill its server process."""

    root: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env_overrides: dict[str, str] = field(default_factory=dict)
    """Set in the environment of the commands run after ``allot up`` (e.g. ALLOT_TOKEN)."""

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["XDG_CONFIG_HOME"] = str(self.root / "config")
        env.pop("ALLOT_URL", None)
        env.pop("ALLOT_TOKEN", None)
        env.update(self.env_overrides)
        return env

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> dict[str, str]:
        return read_client_config(self.root / "config" / "allotment" / "config.json")

    def command(self, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "allotment.cli.main",
            "up",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--tick",
            "0.2",
            "--stop-grace",
            "1",
            *extra,
        ]

    def start(self, *extra: str, wait: bool = True) -> subprocess.Popen[bytes]:
        self.process = subprocess.Popen(
            self.command(*extra),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.processes.append(self.process)
        if wait:
            self.wait_ready()
        return self.process

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                _, err = self.process.communicate()
                raise AssertionError(f"allot up exited {self.process.returncode}: {err.decode()}")
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("allot up did not become ready")

    def client(self) -> AllotmentClient:
        return AllotmentClient(self.url, self.config.get("token"))

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        """Signal the server; return its exit status and what it wrote on stderr. Ended
        by a signal it forwards after a clean shutdown, as uvicorn does, or exit 0/130."""
        assert self.process is not None
        self.process.send_signal(sig)
        _, err = self.process.communicate(timeout=30)
        return self.process.returncode, err.decode()

    def close(self) -> None:
        """Kill the servers still running and every replica they started."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        kill_everything(self.data_dir / "executor")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    deployment = Up(root=tmp_path)
    yield deployment
    deployment.close()
