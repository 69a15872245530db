"""Rich renderings of what the server answers (plain dicts from :mod:`allotment.client`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from allotment.domain.notebook import TOKEN_ENV
from allotment.domain.text import escape_controls

STATE_STYLE = {
    "pending": "yellow",
    "admitted": "cyan",
    "starting": "cyan",
    "running": "green",
    "succeeded": "bold green",
    "failed": "red",
    "preempted": "magenta",
    "cancelled": "dim",
    "reclaimed": "magenta",
}


def when(at: float | None) -> str:
    """Seconds since the epoch as UTC ``2026-12-01 10:20:00`` (the number itself when out
    of the calendar's range)."""
    if at is None:
        return "-"
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError):
        return f"{at:g} s since the epoch"


def ago(at: float | None, now: float | None = None) -> str:
    """``5m`` ago-style age of a time."""
    if at is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - at)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def _gpus(replicas: Sequence[Mapping[str, Any]]) -> str:
    total = 0.0
    for group in replicas:
        gpu = group.get("resources", {}).get("gpu", 0)
        try:
            total += float(gpu) * int(group.get("count", 1))
        except (TypeError, ValueError):
            return "?"
    return f"{total:g}"


def plain(value: object) -> Text:
    """Text a user may have written (a job name, a message) as a cell: control characters
    shown as escapes (``\\x1b``), never sent to the terminal, and no Rich markup."""
    return Text(escape_controls(str(value)))


def fitted_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Text]],
    *,
    title: str | None = None,
    right: Iterable[str] = (),
) -> Table:
    """A table whose first column (ids, copied into other commands) is never shortened;
    the others give way when the terminal is narrow (the CLI prints wide when piped)."""
    table = Table(title=title)
    rows = list(rows)
    aligned = set(right)
    for i, header in enumerate(headers):
        first = max((len(str(row[0])) for row in rows), default=0)
        table.add_column(
            header,
            justify="right" if header in aligned else "left",
            no_wrap=i == 0,
            min_width=max(first, len(header)) if i == 0 else None,
        )
    for row in rows:
        table.add_row(*(plain(cell) if isinstance(cell, str) else cell for cell in row))
    return table


def jobs_table(jobs: Iterable[Mapping[str, Any]], *, title: str | None = None) -> Table:
    rows = [
        [
            job["id"],
            job["name"],
            job["queue"],
            state_text(job["state"]),
            job["priority_class"],
            _gpus(job.get("spec", {}).get("replicas", [])),
            ago(job.get("submit_time")),
            (job.get("reason") or {}).get("code", "") if job["state"] == "pending" else "",
        ]
        for job in jobs
    ]
    headers = ("id", "name", "queue", "state", "class", "gpus", "age", "reason")
    return fitted_table(headers, rows, title=title, right=("gpus", "age"))


def notebook_url(server_url: str, job: Mapping[str, Any]) -> str | None:
    """Where a notebook job opens in a browser: JupyterLab through the proxy, with its
    own token (the browser also needs the API token: sign in to the dashboard first)."""
    if not job.get("endpoint"):
        return None
    token = dict(job.get("spec", {}).get("env") or {}).get(TOKEN_ENV)
    return f"{server_url}{job['endpoint']}lab" + (f"?token={token}" if token else "")


def job_view(job: Mapping[str, Any]) -> Table:
    table = Table(show_header=False, box=None, title=f"job {job['id']}")
    table.add_column(style="bold")
    table.add_column()
    spec = job.get("spec", {})
    rows: list[tuple[str, str | Text]] = [
        ("name", job["name"]),
        ("queue", job["queue"]),
        ("tenant", job["tenant"]),
        ("user", job["user"]),
        ("type", job["type"]),
        ("priority class", job["priority_class"]),
        ("state", state_text(job["state"])),
        ("attempt", str(job["attempt"])),
        ("submitted", when(job["submit_time"])),
        ("gpus", _gpus(spec.get("replicas", []))),
        ("command", " ".join(str(c) for c in spec.get("command", [])) or "-"),
    ]
    if job.get("url"):
        rows.append(("url", job["url"]))
    if job.get("failure_class"):
        rows.append(("failure", job["failure_class"]))
    reason = job.get("reason")
    if reason and job["state"] == "pending":
        rows.append(("reason", f"{reason['code']}: {reason['message']}"))
    for key, value in rows:
        table.add_row(key, plain(value) if isinstance(value, str) else value)
    return table


def events_table(job_id: str, events: Iterable[Mapping[str, Any]]) -> Table:
    rows = []
    for event in events:
        move = ""
        if event.get("to_state"):
            move = f"{event.get('from_state') or '-'} -> {event['to_state']}"
        rows.append([when(event["at"]), event["kind"], move, event.get("message", "")])
    return fitted_table(("at", "kind", "move", "message"), rows, title=f"events of {job_id}")


def why_view(data: Mapping[str, Any]) -> RenderableType:
    lines: list[RenderableType] = []
    head = Text.assemble(("job ", "bold"), (escape_controls(data["job"]), "bold"), " is ")
    head.append_text(state_text(data["state"]))
    lines.append(head)
    reason = data.get("reason")
    if reason:
        lines.append(
            Text.assemble(
                ("why: ", "bold"), escape_controls(f"{reason['code']}: {reason['message']}")
            )
        )
    position = data.get("position")
    if position:
        parts = []
        if position.get("queue") is not None:
            parts.append(f"#{position['queue']} in its queue")
        if position.get("pool") is not None:
            parts.append(f"#{position['pool']} for its pool")
        if parts:
            lines.append(Text.assemble(("position: ", "bold"), ", ".join(parts)))
    if data["state"] == "pending":
        start = data.get("estimated_start")
        if start and data.get("estimate_basis") == "history":
            start += " (guessed from the run times of jobs that finished here)"
        elif not start:
            start = (
                "none: it cannot run on this cluster as it is"
                if reason and (reason.get("detail") or {}).get("permanent")
                else "unknown (a job it waits for has no runtime, and too few like it "
                "have finished here to guess one)"
            )
        lines.append(Text.assemble(("estimated start: ", "bold"), start))
    placement = data.get("placement")
    if placement:
        replicas = ", ".join(
            f"{r['replica']}@{r['node']}" + (f" gpu {r['devices']}" if r["devices"] else "")
            for r in placement["replicas"]
        )
        lines.append(
            Text.assemble(
                ("runs: ", "bold"), f"attempt {placement['attempt']} in pool {placement['pool']}: "
            )
            + Text(replicas)
        )
    holders = data.get("holders") or []
    if holders:
        table = Table(title="holding the GPUs it wants")
        for column in ("job", "queue", "pool", "gpus", "expected end"):
            table.add_column(column)
        for holder in holders:
            end = holder.get("expected_end") or "unknown"
            if holder.get("terminating"):
                end += " (stopping)"
            table.add_row(
                *(plain(cell) for cell in (holder["job"], holder["queue"], holder.get("pool", ""))),
                str(holder["gpu"]),
                end,
            )
        lines.append(table)
    return Group(*lines)


def _usage_text(queue: Mapping[str, Any]) -> str:
    parts = []
    for pool, use in sorted(queue.get("usage", {}).items()):
        text = f"{pool}: {use['used']}/{use['nominal']} gpu"
        if use.get("borrowed"):
            text += f" (+{use['borrowed']} borrowed)"
        parts.append(text)
    counts = f"{queue.get('running', 0)} running, {queue.get('pending', 0)} pending"
    return "  ".join([*parts, counts])


def queues_tree(queues: Sequence[Mapping[str, Any]]) -> Tree:
    tree = Tree("[bold]queues[/bold] (used/nominal GPUs per pool)")

    def add(parent: Tree, queue: Mapping[str, Any]) -> None:
        tenant = f" [dim]({queue['tenant']})[/dim]" if queue.get("tenant") else ""
        node = parent.add(f"[bold]{queue['name']}[/bold]{tenant}  {_usage_text(queue)}")
        for child in queue.get("children", []):
            add(node, child)

    for root in queues:
        add(tree, root)
    return tree


def pools_table(pools: Iterable[Mapping[str, Any]]) -> Table:
    table = Table(title="pools")
    for column in ("pool", "labels", "$/gpu-h", "nodes", "gpus", "allocated", "free"):
        table.add_column(column, justify="left" if column in ("pool", "labels") else "right")
    for pool in pools:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(pool["labels"].items()))
        gpu = pool["gpu"]
        table.add_row(
            pool["name"],
            labels,
            f"{pool['price_per_gpu_hour']:g}",
            str(len(pool["nodes"])),
            str(gpu["capacity"]),
            str(gpu["allocated"]),
            str(gpu["free"]),
        )
    return table


def _bytes(amount: float) -> str:
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
        if amount >= size:
            return f"{amount / size:g}{unit}"
    return f"{amount:g}"


def _pair(node: Mapping[str, Any], key: str, *, memory: bool = False) -> str:
    free = node["free"].get(key, 0)
    capacity = node["capacity"].get(key, 0)
    if memory:
        return f"{_bytes(free)}/{_bytes(capacity)}"
    return f"{free:g}/{capacity:g}"


def nodes_table(nodes: Iterable[Mapping[str, Any]]) -> Table:
    table = Table(title="nodes (free/capacity)")
    for column in ("node", "pool", "healthy", "gpu", "cpu", "memory", "jobs"):
        table.add_column(column, overflow="fold")
    for node in nodes:
        jobs = ", ".join(sorted({j["job"] for j in node["jobs"]}))
        table.add_row(
            node["name"],
            node["pool"],
            "yes" if node["healthy"] else Text("no", style="red"),
            _pair(node, "gpu"),
            _pair(node, "cpu"),
            _pair(node, "memory", memory=True),
            jobs or "-",
        )
    return table


def images_view(data: Mapping[str, Any]) -> RenderableType:
    """``allot images``: each image with the nodes holding it (or why that is not
    known), the patterns the caller's tenant may run, and what the runtime enforces."""
    runtime = data.get("runtime", "?")
    parts: list[RenderableType] = []
    if not data.get("known"):
        message = data.get("message") or "the images are not known"
        parts.append(Text(f"runtime {runtime}: {message}", style="yellow"))
    else:
        nodes = data.get("nodes", [])
        holders: dict[str, list[str]] = {}
        for node in nodes:
            for image in node.get("images", []):
                holders.setdefault(image, []).append(node["node"])
        rows = [
            [
                image,
                f"all {len(nodes)}" if len(held) == len(nodes) > 1 else ", ".join(held),
            ]
            for image, held in sorted(holders.items())
        ]
        parts.append(fitted_table(("image", "nodes"), rows, title=f"images (runtime {runtime})"))
        if not rows:
            parts.append(Text("  no image you may see is on any node", style="dim"))
    allowed = data.get("allowed")
    if allowed is not None:
        shown = ", ".join(allowed) if allowed else "none"
        parts.append(Text(f"your tenant may run: {shown}"))
    enforcement = data.get("enforcement") or {}
    if enforcement:
        table = Table(title="isolation", show_header=False, box=None)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for aspect, text in enforcement.items():
            style = "red" if "NOT enforced" in str(text) else ""
            table.add_row(str(aspect), Text(str(text), style=style))
        parts.append(table)
    return Group(*parts)


def _compact(value: Any, width: int = 60) -> str:
    """A JSON value on one line (``"8"``, ``null``, ``2``), cut to ``width`` with ``…``;
    control characters shown escaped."""
    text = escape_controls(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))
    return text if len(text) <= width else text[: width - 1] + "…"


def diff_view(result: Mapping[str, Any]) -> RenderableType:
    lines: list[RenderableType] = []
    if result["dry_run"]:
        lines.append(Text("dry run: nothing was changed", style="bold"))
    elif result["applied"]:
        lines.append(Text(f"applied as version {result['version']}", style="bold green"))
    else:
        lines.append(Text(f"unchanged: version {result['version']} is this text", style="bold"))
    any_change = False
    for section, change in result["diff"].items():
        for sign, key, style in (("+", "added", "green"), ("-", "removed", "red")):
            for name in change[key]:
                lines.append(Text(f"  {sign} {section}: {name}", style=style))
                any_change = True
        fields = change.get("fields") or {}
        for name in change["changed"]:
            lines.append(Text(f"  ~ {section}: {name}", style="yellow"))
            for field in fields.get(name, ()):
                old, new = _compact(field.get("old")), _compact(field.get("new"))
                path = escape_controls(str(field["path"]))
                lines.append(Text(f"      {path}: {old} → {new}"))
            any_change = True
    if not any_change:
        lines.append(Text("  no differences from the cluster in use"))
    return Group(*lines)


def top_view(queues: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]]) -> Group:
    title = f"running and starting jobs at {when(time.time())} UTC"
    return Group(queues_tree(queues), jobs_table(jobs, title=title))
