"""A notebook's own activity, as its JupyterLab reports it: the last time one of its
kernels did something (``GET <prefix>/api/kernels``: each kernel's ``last_activity``, and
now for one that is busy computing), or when the server started if no kernel did since.
Requests of a browser tab left open do not count (JupyterLab polls the server on its
own), so a notebook is idle when no code ran for the window. Reaping counts a notebook
idle only when its GPUs are idle *and* it saw no such activity for as long
(:func:`allotment.upkeep.reaping.decide`).

Asked on the loopback address at the port the notebook was given, with its own token,
within a second; a notebook that does not answer (a custom command, still starting,
gone) has no activity to add, and only its GPUs count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import httpx

from allotment.domain.notebook import TOKEN_ENV, notebook_path
from allotment.domain.service import PORT_ENV

TIMEOUT_S = 1.0
HOST = "127.0.0.1"


def _epoch(stamp: object) -> float:
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def kernel_activity(
    job_id: str, spec: Mapping[str, Any], *, clock: Callable[[], float] = time.time
) -> float | None:
    """When notebook ``job_id`` (its stored ``spec``) last ran code, in seconds since
    the epoch, or ``None`` when it does not say."""
    env = dict(spec.get("env") or {})
    port, token = env.get(PORT_ENV), env.get(TOKEN_ENV)
    if port is None:
        return None
    base = f"http://{HOST}:{port}{notebook_path(job_id)}api/"
    params = {"token": token} if token else None
    try:
        with httpx.Client(timeout=TIMEOUT_S, params=params) as client:
            status = client.get(base + "status")
            kernels = client.get(base + "kernels")
        if status.status_code != 200 or kernels.status_code != 200:
            return None
        times = [_epoch(status.json()["started"])]
        for kernel in kernels.json():
            times.append(_epoch(kernel["last_activity"]))
            if kernel.get("execution_state") == "busy":
                times.append(clock())
        return max(times)
    except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError):
        return None
