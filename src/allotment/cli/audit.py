"""``allot audit``: read the audit trail, or verify its hash chain."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from allotment.cli.common import Output, OutputOption, console, print_error, print_json
from allotment.cli.live import TokenOption, UrlOption, connect
from allotment.cli.live_render import fitted_table, when
from allotment.domain.durations import parse_duration

MAX_LIMIT = 500


def audit_table(records: Iterable[Mapping[str, Any]]) -> Table:
    rows: list[list[str | Text]] = [
        [
            str(r["id"]),
            when(r.get("at")),
            str(r.get("user", "")),
            str(r.get("tenant") or "-"),
            str(r.get("action", "")),
            str(r.get("object", "")),
            str(r.get("source", "")),
            Text(str(r.get("result", "")), style="green" if r.get("result") == "ok" else "red"),
        ]
        for r in records
    ]
    headers = ("id", "at (UTC)", "user", "tenant", "action", "object", "from", "result")
    return fitted_table(headers, rows, title="audit trail", right=("id",))


def audit(
    user: Annotated[str | None, typer.Option("--user", help="Only this user's calls.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's.")] = None,
    action: Annotated[
        str | None, typer.Option("--action", help="Only this action, e.g. job.submit.")
    ] = None,
    obj: Annotated[
        str | None, typer.Option("--object", help="Only this object, e.g. a job id.")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only the last ..., e.g. 7d, 12h.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_LIMIT, help="At most, oldest first.")
    ] = 100,
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Check the hash chain; exit 1 naming the first bad record."),
    ] = False,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """The audit trail: who did what, when, from where, with what result."""
    start = None if since is None else time.time() - parse_duration(since, name="--since")
    with connect(url, token) as client:
        if verify:
            data = client.verify_audit()
        else:
            data = client.audit(
                user=user, tenant=tenant, action=action, object=obj, since=start, limit=limit
            )
    if verify:
        _report(data, output)
        return
    if output is Output.JSON:
        print_json(data)
        return
    console().print(audit_table(data["records"]))
    if data.get("next_after"):
        typer.echo(f"(more: raise --limit above {limit} or narrow the filters)", err=True)


def _report(data: dict[str, Any], output: Output) -> None:
    bad = data.get("first_bad")
    if output is Output.JSON:
        print_json(data)
    elif bad is None:
        typer.echo(f"audit chain intact: {data['checked']} records, head {data['head_hash']}")
    if bad is not None:
        print_error(
            f"audit chain broken at record {bad['id']}: {bad['problem']} "
            f"({data['checked']} records checked)"
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(name="audit")(audit)
