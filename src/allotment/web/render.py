"""The dashboard page, rendered on the server from plain data: no script, no assets
from elsewhere, every value escaped. The page refreshes itself every few seconds.

Takes the API's wire dictionaries (jobs as ``JobOut`` dumps, queues as ``QueueOut``
dumps) so that it shows exactly what the API says.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REFRESH_S = 5

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d232a;background:#fafbfc}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.05rem;margin:1.6rem 0 .4rem}
.sub{color:#5b6570;font-size:.85rem}
table{border-collapse:collapse;width:100%;font-size:.85rem;background:#fff}
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #e3e7ea;vertical-align:top}
th{background:#f1f3f5;font-weight:600}
code{font-size:.8rem}.empty{color:#8a939b;font-style:italic}
.s-running,.s-succeeded{color:#1f7a3a}.s-failed,.s-reclaimed{color:#b3261e}
.s-pending,.s-admitted,.s-starting{color:#8a5a00}
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _when(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + "Z"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _state(job: Mapping[str, Any]) -> str:
    state = str(job.get("state", ""))
    failure = job.get("failure_class")
    text = f"{state} ({failure})" if failure else state
    return f'<span class="s-{_e(state)}">{_e(text)}</span>'


def _queue_rows(queues: Sequence[Mapping[str, Any]], depth: int = 0) -> list[list[str]]:
    rows: list[list[str]] = []
    for queue in queues:
        nominal = ", ".join(f"{pool}: {gpus}" for pool, gpus in queue["nominal_gpu"].items())
        indent = "&nbsp;&nbsp;" * depth
        rows.append([f"{indent}{_e(queue['name'])}", _e(queue.get("tenant") or ""), _e(nominal)])
        rows.extend(_queue_rows(queue.get("children", []), depth + 1))
    return rows


def dashboard_page(
    *,
    active: Sequence[Mapping[str, Any]],
    waiting: Sequence[Mapping[str, Any]],
    finished: Sequence[Mapping[str, Any]],
    queues: Sequence[Mapping[str, Any]],
    now: float,
) -> str:
    """The whole page: queues, running and waiting jobs (with why), recent ends."""
    active_rows = (
        [
            f"<code>{_e(j['id'])}</code>",
            _e(j.get("name")),
            _e(j.get("queue")),
            _state(j),
            _e(j.get("attempt")),
        ]
        for j in active
    )
    waiting_rows = (
        [
            f"<code>{_e(j['id'])}</code>",
            _e(j.get("name")),
            _e(j.get("queue")),
            _e((j.get("reason") or {}).get("code", "")),
            _e((j.get("reason") or {}).get("message", "not yet looked at")),
        ]
        for j in waiting
    )
    finished_rows = (
        [
            f"<code>{_e(j['id'])}</code>",
            _e(j.get("name")),
            _e(j.get("queue")),
            _state(j),
            _e(_when(j.get("updated_at"))),
        ]
        for j in finished
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_S}">
<title>Allotment</title><style>{_STYLE}</style></head>
<body>
<h1>Allotment</h1>
<div class="sub">as of {_e(_when(now))} &middot; refreshes every {REFRESH_S} s</div>
<h2>Queues</h2>
{_table(["queue", "tenant", "nominal GPUs"], _queue_rows(queues), "no queues")}
<h2>Running ({len(active)})</h2>
{_table(["job", "name", "queue", "state", "attempt"], active_rows, "nothing runs")}
<h2>Waiting ({len(waiting)})</h2>
{_table(["job", "name", "queue", "reason", "why"], waiting_rows, "nothing waits")}
<h2>Recently ended</h2>
{_table(["job", "name", "queue", "state", "at"], finished_rows, "nothing has ended yet")}
</body></html>
"""
