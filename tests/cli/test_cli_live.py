"""The live CLI commands against a real server (a live stack from ``tests.api.live``):
in-process with CliRunner, and once as the ``allot`` console script in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.api.conftest import EXAMPLES
from tests.api.live import Live, job_text, live_stack
from typer.testing import CliRunner

import allotment
from allotment.api.serving import free_port
from allotment.cli.main import app
from allotment.clientconfig import load_client_config, write_client_config
from allotment.domain.lifecycle import JobState

S = JobState
SLEEP = "import time; time.sleep(60)"
runner = CliRunner()


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("ALLOT_TOKEN", raising=False)
    with live_stack(tmp_path) as stack:
        monkeypatch.setenv("ALLOT_URL", stack.url)
        yield stack


def allot(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_submit_ls_get_events(live: Live, tmp_path: Path) -> None:
    code, out, err = allot("submit", write(tmp_path, "job.json", job_text(SLEEP, name="first")))
    assert code == 0, err
    job = out.strip()
    assert job.startswith("j") and "\n" not in job

    code, out, _ = allot("ls", "-o", "json")
    page = json.loads(out)
    assert [j["id"] for j in page["jobs"]] == [job]
    code, out, _ = allot("ls", "--state", "pending")
    assert code == 0 and job in out and "first" in out
    code, out, _ = allot("ls", "--queue", "batch", "-o", "json")
    assert json.loads(out)["jobs"] == []

    code, out, _ = allot("get", job)
    assert code == 0 and "first" in out and "pending" in out
    assert json.loads(allot("get", job, "-o", "json")[1])["state"] == "pending"
    code, out, _ = allot("events", job)
    assert code == 0 and "submitted -> pending" in out
    events = json.loads(allot("events", job, "-o", "json")[1])
    assert [e["to_state"] for e in events] == ["submitted", "pending"]


def test_a_typo_in_the_job_file_names_key_and_line(live: Live, tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "name: x\nqueue: default\nreplica:\n  - {count: 1}\n")
    code, out, err = allot("submit", path)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and "line 3" in err and "replica" in err
    assert "Traceback" not in err


def test_an_unknown_queue_lists_the_queues(live: Live, tmp_path: Path) -> None:
    code, _, err = allot("run", "--queue", "nope", "--", "true")
    assert code == 1 and "nope" in err and "default" in err and "batch" in err


def test_run_builds_a_job(live: Live) -> None:
    code, out, err = allot(
        "run", "--gpus", "2", "--name", "probe", "--max-runtime", "10m", "--",
        sys.executable, "-c", "print(1)",
    )  # fmt: skip
    assert code == 0, err
    job = json.loads(allot("get", out.strip(), "-o", "json")[1])
    assert job["name"] == "probe" and job["queue"] == "default"
    assert job["spec"]["command"] == [sys.executable, "-c", "print(1)"]
    assert float(job["spec"]["replicas"][0]["resources"]["gpu"]) == 2
    assert job["spec"]["max_runtime"] == 600


def test_why_human_and_json(live: Live, tmp_path: Path) -> None:
    big = allot(
        "submit", write(tmp_path, "big.json", job_text(SLEEP, gpus=2, expected_runtime="1h"))
    )
    live.until(big[1].strip(), {S.RUNNING})
    small = allot("submit", write(tmp_path, "small.json", job_text(SLEEP)))[1].strip()
    live.step()

    code, out, err = allot("why", small)
    assert code == 0, err
    assert "pending" in out and "why:" in out and "#1 in its queue" in out
    assert "estimated start: 20" in out and big[1].strip() in out
    data = json.loads(allot("why", small, "-o", "json")[1])
    assert data["job"] == small and data["reason"]["code"] in ("quota_exhausted", "no_node_fits")
    assert data["holders"][0]["job"] == big[1].strip()

    code, out, _ = allot("why", big[1].strip())
    assert code == 0 and "running" in out and "worker-0@localhost" in out


def test_logs_and_follow(live: Live, tmp_path: Path) -> None:
    code = "import time, sys\nfor i in range(3):\n print('line', i, flush=True); time.sleep(0.3)"
    job = allot("submit", write(tmp_path, "job.json", job_text(code)))[1].strip()
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            live.step()
            time.sleep(0.05)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        code_, out, err = allot("logs", job, "-f", "--interval", "0.1")
    finally:
        stop.set()
        driver.join(timeout=10)
    assert code_ == 0, err
    assert out == "line 0\nline 1\nline 2\n"
    assert allot("logs", job)[1] == out
    data = json.loads(allot("logs", job, "-o", "json", "--stream", "err")[1])
    assert data["data"] == "" and data["eof"] and data["replica"] == "worker-0"
    code_, _, err = allot("logs", job, "--replica", "worker-9")
    assert code_ == 1 and "worker-0" in err


def test_queues_pools_nodes_top(live: Live, tmp_path: Path) -> None:
    big = allot("submit", write(tmp_path, "big.json", job_text(SLEEP, gpus=2)))[1].strip()
    live.until(big, {S.RUNNING})

    code, out, _ = allot("queues")
    assert code == 0 and "workstation" in out and "local: 2/1 gpu (+1 borrowed)" in out
    tree = json.loads(allot("queues", "-o", "json")[1])
    assert tree[0]["children"][0]["usage"]["local"]["borrowed"] == 1
    code, out, _ = allot("pools")
    assert code == 0 and "gpu_model=virtual" in out
    assert json.loads(allot("pools", "-o", "json")[1])[0]["gpu"]["free"] == 0
    code, out, _ = allot("nodes")
    assert code == 0 and "localhost" in out and big in out
    assert json.loads(allot("nodes", "-o", "json")[1])[0]["jobs"][0]["job"] == big
    code, out, _ = allot("top", "--once")
    assert code == 0 and "workstation" in out and big in out
    frame = json.loads(allot("top", "-o", "json")[1])
    assert [j["id"] for j in frame["jobs"]] == [big] and frame["queues"][0]["name"]


def test_apply_dry_run_then_apply(live: Live, tmp_path: Path) -> None:
    text = (EXAMPLES / "cluster-local.yaml").read_text() + (
        "  - name: extra\n    quota: {local: {gpu: 0}}\n"
    )
    path = write(tmp_path, "cluster.yaml", text)
    code, out, err = allot("apply", "-f", path, "--dry-run")
    assert code == 0, err
    assert "dry run" in out and "+ queues: extra" in out
    code, out, _ = allot("apply", "-f", path)
    assert code == 0 and "applied as version 1" in out
    data = json.loads(allot("apply", "-f", path, "-o", "json")[1])
    assert (data["applied"], data["version"]) == (False, 1)
    weightier = write(
        tmp_path, "weightier.yaml", text.replace("gpu: 0}}", "gpu: 0}}\n    weight: 2")
    )
    code, out, err = allot("apply", "-f", weightier, "--dry-run")
    assert code == 0, err
    assert "  ~ queues: extra\n      spec.weight: 1.0 → 2.0\n" in out
    bad = write(tmp_path, "bad.yaml", "pools:\n  - name: a\n    colour: x\n")
    code, out, err = allot("apply", "-f", bad)
    assert code == 1 and "line 3" in err and "colour" in err and out == ""
    code, _, err = allot("apply", "-f", str(tmp_path / "missing.yaml"))
    assert code == 1 and "no such file" in err


def test_unknown_job_and_unreachable_server(live: Live) -> None:
    code, out, err = allot("get", "j-nope")
    assert code == 1 and out == "" and err.startswith("error: ") and "j-nope" in err
    port = free_port()
    code, _, err = allot("ls", "--url", f"http://127.0.0.1:{port}")
    assert code == 1 and "allot up" in err and "Traceback" not in err


def test_config_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("ALLOT_URL", raising=False)
    monkeypatch.delenv("ALLOT_TOKEN", raising=False)
    assert load_client_config() == ("http://127.0.0.1:8642", None)
    path = write_client_config("http://127.0.0.1:9999", "tok")
    assert path == tmp_path / "allotment" / "config.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == {"url": "http://127.0.0.1:9999", "token": "tok"}
    assert load_client_config() == ("http://127.0.0.1:9999", "tok")
    monkeypatch.setenv("ALLOT_URL", "http://10.0.0.1:1")
    assert load_client_config() == ("http://10.0.0.1:1", None)  # the file's token stays home
    monkeypatch.setenv("ALLOT_TOKEN", "other")
    assert load_client_config() == ("http://10.0.0.1:1", "other")
    path.write_text("[1, 2]")
    code, _, err = allot("ls")
    assert code == 1 and "not a JSON object" in err


def test_cli_finds_the_server_from_the_config_file(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALLOT_URL")
    write_client_config(live.url, None)
    code, out, err = allot("pools", "-o", "json")
    assert code == 0, err
    assert json.loads(out)[0]["name"] == "local"


def _console_script() -> str | None:
    beside = Path(sys.executable).parent / "allot"
    return str(beside) if beside.exists() else shutil.which("allot")


def test_the_allot_console_script(live: Live, tmp_path: Path) -> None:
    script = _console_script()
    if script is None:
        pytest.skip("the allot console script is not installed")
    src = str(Path(allotment.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "ALLOT_URL": live.url,
        "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
    }
    job = write(tmp_path, "job.json", job_text(SLEEP, name="scripted"))
    done = subprocess.run(
        [script, "submit", job], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    done = subprocess.run(
        [script, "why", job_id, "-o", "json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["job"] == job_id
    done = subprocess.run(
        [script, "get", "j-missing"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stderr.startswith("error: ")
