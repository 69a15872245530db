"""``allot alerts``: the alerts of the caller's tenant (all tenants' for a platform
admin), with the state of their webhook delivery."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from allotment.cli.common import Output, OutputOption, console, print_json
from allotment.cli.live import TokenOption, UrlOption, connect
from allotment.cli.live_render import fitted_table, when
from allotment.domain.durations import parse_duration

MAX_LIMIT = 500
DELIVERY_STYLE = {"delivered": "green", "pending": "yellow", "failed": "red", "none": "dim"}


def alerts_table(alerts: Iterable[Mapping[str, Any]]) -> Table:
    rows: list[list[str | Text]] = []
    for a in alerts:
        delivery = str(a.get("delivery", ""))
        shown = (
            delivery if delivery != "pending" or not a.get("tries") else f"retrying ({a['tries']})"
        )
        rows.append(
            [
                str(a["id"]),
                when(a.get("at")),
                str(a.get("kind", "")),
                str(a.get("tenant") or "-"),
                str(a.get("job") or "-"),
                Text(shown, style=DELIVERY_STYLE.get(delivery, "")),
                str(a.get("message", "")),
            ]
        )
    headers = ("id", "at (UTC)", "kind", "tenant", "job", "webhook", "message")
    return fitted_table(headers, rows, title="alerts", right=("id",))


def alerts(
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only this kind, e.g. max_wait.")
    ] = None,
    job: Annotated[str | None, typer.Option("--job", help="Only this job's.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only the last ..., e.g. 7d, 12h.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_LIMIT, help="At most, oldest first.")
    ] = 100,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Alerts (a job waiting past its queue's max_wait, ...) and their webhook delivery."""
    start = None if since is None else time.time() - parse_duration(since, name="--since")
    with connect(url, token) as client:
        data = client.alerts(kind=kind, job=job, since=start, limit=limit)
    if output is Output.JSON:
        print_json(data)
        return
    console().print(alerts_table(data["alerts"]))
    if data.get("next_after"):
        typer.echo(f"(more: raise --limit above {limit} or narrow the filters)", err=True)


def register(app: typer.Typer) -> None:
    app.command(name="alerts")(alerts)
