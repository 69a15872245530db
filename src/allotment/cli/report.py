"""``allot report``: usage, waste and cost per group, waits, failures, preemptions and
reclaims, as tables, CSV, a self-contained HTML file, or JSON (the tables, the CSV and
the HTML are :mod:`allotment.web.report`'s and :mod:`allotment.web.report_html`'s, the
same as the dashboard's reports page)."""

from __future__ import annotations

import io
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from allotment.cli.common import Output, OutputOption, console
from allotment.cli.live import TokenOption, UrlOption, connect
from allotment.domain.errors import InvalidInput
from allotment.web.report import Section, csv_text, sections, title


class Format(StrEnum):
    TABLE = "table"
    CSV = "csv"
    HTML = "html"


class By(StrEnum):
    TENANT = "tenant"
    QUEUE = "queue"
    POOL = "pool"
    USER = "user"
    TYPE = "type"


def rich_table(section: Section) -> Table:
    """A Rich table of ``section``; every cell is plain text (no markup)."""
    table = Table(title=section.title, title_justify="left")
    for i, header in enumerate(section.headers):
        table.add_column(header, justify="right" if i in section.right else "left")
    for row in section.rows:
        table.add_row(*(Text(cell) for cell in row))
    if not section.rows:
        table.add_row(*(Text("-" if i == 0 else "") for i in range(len(section.headers))))
    return table


def report(
    since: Annotated[
        str, typer.Option("--since", help="Start: a duration before --until (7d, 12h), or a time.")
    ] = "7d",
    until: Annotated[
        str | None,
        typer.Option("--until", help="End: an ISO 8601 time or epoch seconds; default now."),
    ] = None,
    by: Annotated[By, typer.Option("--by", help="Group usage and cost by this.")] = By.TENANT,
    fmt: Annotated[
        Format, typer.Option("--format", help="table, csv (usage rows), or html (with charts).")
    ] = Format.TABLE,
    jobs: Annotated[
        bool, typer.Option("--jobs", help="Include one record per job attempt (JSON, HTML).")
    ] = False,
    out: Annotated[
        str | None, typer.Option("--out", help="Write to this file instead of stdout.")
    ] = None,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Usage, waste and cost per tenant, queue, pool, user or job type; wait times,
    failures, preemptions and reclaims."""
    target = Path(out) if out is not None else None
    if target is not None and target.is_dir():
        raise InvalidInput(f"--out {out} is a directory; name a file", fields={"path": out})
    with connect(url, token) as client:
        data = client.report(since=since, until=until, by=by.value, jobs=jobs)
    if output is Output.JSON:
        _emit(json.dumps(data, indent=2) + "\n", target)
    elif fmt is Format.CSV:
        _emit(csv_text(data), target)
    elif fmt is Format.HTML:
        from allotment.web.report_html import html_report

        _emit(html_report(data), target)
    else:
        from rich.console import Console

        buffer = io.StringIO()
        show = console() if target is None else Console(file=buffer, width=200, highlight=False)
        show.print(Text(title(data), style="bold"))
        for section in sections(data):
            show.print(rich_table(section))
        if target is not None:
            _emit(buffer.getvalue(), target)


def _emit(text: str, target: Path | None) -> None:
    if target is None:
        typer.echo(text, nl=False)
        return
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            f"cannot write {target}: {exc.strerror or exc}", fields={"path": str(target)}
        ) from None
    typer.echo(f"wrote {target}", err=True)


def register(app: typer.Typer) -> None:
    app.command(name="report")(report)
