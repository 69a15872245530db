"""Notebooks: a ``type: notebook`` job serves on a port of its own, reached through the
API server at ``/nb/<job>/``; one without a command runs JupyterLab there.

Pure: the API passes the job's id, the port it picked, the interpreter that provides
JupyterLab (the server's own, on the process runtime) and a fresh token.
"""

from __future__ import annotations

from allotment.domain.job import JobSpec, JobType
from allotment.domain.service import PORT_ENV

NOTEBOOK_PREFIX = "/nb"
"""Where the API server proxies notebooks: ``/nb/<job>/...``."""
TOKEN_ENV = "JUPYTER_TOKEN"
"""JupyterLab's own token (it reads this variable), asked for besides the API's."""


def notebook_path(job_id: str) -> str:
    """The notebook's address on the API server: JupyterLab's ``base_url``."""
    return f"{NOTEBOOK_PREFIX}/{job_id}/"


def jupyterlab_command(job_id: str, port: int, *, python: str | None) -> list[str]:
    """The command that serves JupyterLab for notebook ``job_id`` on ``port`` of the
    loopback address, under the proxy's prefix: ``python -m jupyterlab`` with the given
    interpreter, or the image's ``jupyter lab`` when ``python`` is ``None``."""
    launcher = [python, "-m", "jupyterlab"] if python is not None else ["jupyter", "lab"]
    return [
        *launcher,
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={notebook_path(job_id)}",
        "--ServerApp.root_dir=.",
        "--ServerApp.allow_root=True",  # the replica runs as whoever runs it; nothing more
        "--ServerApp.allow_remote_access=True",  # the proxy's Host: it listens on loopback
    ]


def serving_notebook(
    spec: JobSpec, *, job_id: str, port: int, token: str, python: str | None
) -> JobSpec:
    """``spec`` (a notebook) with what serving it needs: ``$PORT``, a JupyterLab token
    when it names none, and, when it has no command, the JupyterLab command."""
    assert spec.type is JobType.NOTEBOOK
    env = {PORT_ENV: str(port), **spec.env}
    env.setdefault(TOKEN_ENV, token)
    command = spec.command or jupyterlab_command(job_id, int(env[PORT_ENV]), python=python)
    return spec.model_copy(update={"env": env, "command": command})
