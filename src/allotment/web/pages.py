"""The dashboard's pages, rendered on the server with Jinja2 templates (``templates/``)
and a little htmx (``static/``, shipped with its licence): the live parts of a page
reload themselves every two seconds as fragments, without a full reload.

Autoescaping is on for every template: whatever users wrote (job names, commands, log
lines) is shown as text, never as markup. The pages take the API's wire dictionaries,
so that they show exactly what the API says.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
"""Served at ``/ui/static``."""


def _when(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + "Z"


def _num(value: float | int | None) -> str:
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def sparkline(points: Sequence[tuple[float, float]], *, top: float, label: str) -> Markup:
    """A small line chart (inline SVG) of ``(time, value)`` points on ``0..top``; numbers
    only, so nothing in it needs escaping but ``label``."""
    if len(points) < 2 or top <= 0:
        return Markup('<p class="empty">{}</p>').format("not enough samples yet")
    first, last = points[0][0], points[-1][0]
    span = max(last - first, 1e-9)
    width, height = 600.0, 60.0
    coords = " ".join(
        f"{(t - first) / span * width:.1f},{height - min(v, top) / top * height:.1f}"
        for t, v in points
    )
    return Markup(
        '<svg class="spark" viewBox="0 0 {w:.0f} {h:.0f}" preserveAspectRatio="none" '
        'role="img" aria-label="{label}"><polyline fill="none" stroke="currentColor" '
        'stroke-width="1.5" vector-effect="non-scaling-stroke" points="{coords}"/></svg>'
    ).format(w=width, h=height, label=label, coords=coords)


@cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["num"] = _num
    env.filters["duration"] = _duration
    env.globals["sparkline"] = sparkline
    macros = env.get_template("macros.html").module
    env.globals.update(bar=macros.bar, state=macros.state, jobs_table=macros.jobs_table)  # type: ignore[attr-defined]
    return env


def render(template: str, **context: Any) -> str:
    """``template`` (a file of ``templates/``) rendered with ``context``."""
    return environment().get_template(template).render(**context)
