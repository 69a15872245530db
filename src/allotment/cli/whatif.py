"""``allot whatif`` and ``allot history export``: recorded history replayed under a
proposed configuration, and exported as a trace (the server does the work, see
:mod:`allotment.sim.whatif`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from allotment.cli.common import Output, OutputOption, console, print_json
from allotment.cli.live import TokenOption, UrlOption, connect, read_text
from allotment.domain.errors import InvalidInput
from allotment.sim.whatif_figures import got_worse
from allotment.web.report import ratio, seconds

SinceOption = Annotated[
    str, typer.Option("--since", help="Start: a duration before --until (7d, 12h), or a time.")
]
UntilOption = Annotated[
    str | None,
    typer.Option("--until", help="End: an ISO 8601 time or epoch seconds; default now."),
]


def _cell(row: Mapping[str, Any], key: str, fmt: Any) -> Text:
    """``recorded / in force -> proposed`` of one figure; red where it gets worse, green
    where it gets better (by the same measure)."""
    recorded, current, proposed = row["recorded"], row["current"], row.get("proposed")
    text = Text(f"{fmt(recorded.get(key))} / {fmt(current.get(key))}")
    if proposed is not None:
        a, b = current.get(key), proposed.get(key)
        style = "red" if got_worse(key, a, b) else "green" if got_worse(key, b, a) else ""
        text.append(" -> ")
        text.append(fmt(b), style=style)
    return text


def comparison_view(data: Mapping[str, Any]) -> RenderableType:
    """The what-if as tables: per queue and per tenant, recorded / replayed in force ->
    proposed, with each queue's fidelity error next to its figures."""
    parts: list[RenderableType] = []
    fidelity = data["fidelity"]
    head = Text(
        f"{data['jobs']} jobs recorded, replayed under policy {data['policy']}; "
        f"in {data['replay_s']:.2f} s",
        style="bold",
    )
    parts.append(head)
    rows: list[tuple[str, Sequence[Mapping[str, Any]]]] = [
        ("queue", data["queues"]),
        ("tenant", data["tenants"]),
    ]
    if data.get("total"):
        rows.append(("fleet", [data["total"]]))
    proposed = any(r.get("proposed") for _, group in rows for r in group)
    arrow = " -> proposed" if proposed else ""
    columns: tuple[tuple[str, tuple[tuple[str, str, Any], ...]], ...] = (
        (
            "waits",
            (
                ("wait avg", "wait_avg_s", seconds),
                ("p50", "wait_p50_s", seconds),
                ("p95", "wait_p95_s", seconds),
                ("p99", "wait_p99_s", seconds),
                ("JCT avg", "jct_avg_s", seconds),
                ("not started", "censored", _count),
            ),
        ),
        (
            "use",
            (
                ("utilisation", "utilization", ratio),
                ("borrowed GPU-h", "borrowed_gpu_hours", _count),
                ("cost", "cost", _count),
                ("preemptions", "preemptions", _count),
                ("violations", "guarantee_violations", _count),
            ),
        ),
    )
    for label, group in rows:
        for kind, figures in columns:
            table = Table(
                title=f"{kind} per {label}: recorded / replayed in force{arrow}",
                title_justify="left",
            )
            table.add_column(label)
            table.add_column("jobs", justify="right")
            for header, _, _ in figures:
                table.add_column(header, justify="right")
            table.add_column("fidelity error", justify="right")
            for row in group:
                err = row.get("wait_error")
                late = err is not None and err > fidelity["target"]
                table.add_row(
                    Text(row["name"]),
                    str(row["recorded"]["jobs"]),
                    *(_cell(row, key, fmt) for _, key, fmt in figures),
                    Text(f"±{ratio(err)}", style="red" if late else ""),
                )
            parts.append(table)
    rho = fidelity.get("order_agreement")
    parts.append(
        Text(
            f"fidelity: the replay of the configuration in force against what happened: "
            f"mean wait error {ratio(fidelity.get('wait_error'))} over the fleet, worst queue "
            f"{ratio(fidelity.get('worst_queue_error'))} (target {ratio(fidelity['target'])})"
            + ("" if rho is None else f"; admission order agreement {rho:.2f}")
        )
    )
    assumed = data["assumed"]
    said = [
        f"{assumed[key]} {words}"
        for key, words in (
            ("estimated_runs", "run times estimated"),
            ("open_runs", "runs still going at the end"),
            ("withdrawn", "jobs cancelled while waiting"),
            ("default_priority_class", "jobs given their queue's default class"),
            ("unknown_queue", "jobs of a queue no stored version has left out"),
        )
        if assumed.get(key)
    ]
    said.append(
        f"the loop's turn {assumed['turn_s']:g} s, an end seen "
        f"{assumed['end_latency_s']:g} s after it and a preemption's stop "
        f"{assumed['stop_latency_s']:g} s, read from the recording"
    )
    parts.append(Text("assumed: " + "; ".join(said), style="dim"))
    for line in data["worse"]:
        parts.append(Text(f"worse: {line}", style="red"))
    if proposed and not data["worse"]:
        parts.append(Text("nothing gets worse by more than 5%", style="green"))
    parts.append(Text("the replay cannot know:", style="dim"))
    for limit in data["limits"]:
        parts.append(Text(f"  - {limit}", style="dim"))
    return Group(*parts)


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def whatif(
    file: Annotated[
        str | None,
        typer.Option(
            "--file", "-f", help="The proposed cluster.yaml; without it, only the fidelity."
        ),
    ] = None,
    since: SinceOption = "7d",
    until: UntilOption = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy", "-p", help="Scheduler policy to replay with; default the server's."
        ),
    ] = None,
    plot: Annotated[
        str | None,
        typer.Option("--plot", metavar="DIR", help="Write charts into DIR (created if missing)."),
    ] = None,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Replay the jobs recorded over a window under the configuration in force and under
    a proposed one; compare per queue and tenant with what really happened."""
    text = read_text(file) if file is not None else None
    if plot is not None:
        from allotment.sim.plots import plot_directory

        plot_directory(Path(plot))
    with connect(url, token) as client:
        data = client.whatif(text, since=since, until=until, policy=policy, series=plot is not None)
    show_comparison(data, output, plot)


def show_comparison(data: dict[str, Any], output: Output, plot: str | None = None) -> None:
    """Print a what-if answer (and draw its charts into ``plot``)."""
    written: list[Path] = []
    if plot is not None and data.get("series"):
        from allotment.sim.whatif_plots import write_whatif_plots

        written = write_whatif_plots(data, Path(plot))
    if output is Output.JSON:
        print_json(data)
    else:
        console().print(comparison_view(data))
    for path in written:
        typer.echo(f"wrote {path}", err=True)


history = typer.Typer(help="Recorded history.", no_args_is_help=True)


@history.command("export")
def export(
    since: SinceOption = "7d",
    until: UntilOption = None,
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="Write the CSV here instead of stdout.")
    ] = None,
    users: Annotated[
        bool,
        typer.Option(
            "--users",
            help="Add a user column of pseudonyms (u1, u2, ...): whose jobs are the same "
            "person's, never who (start forecasts learn per user).",
        ),
    ] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Export the jobs recorded over a window as a trace CSV for ``allot sim``, without
    job names, commands or users (``--users``: pseudonyms)."""
    with connect(url, token) as client:
        text, left_out = client.history_export(since=since, until=until, users=users)
    if out is None:
        typer.echo(text, nl=False)
    else:
        target = Path(out)
        if target.is_dir():
            raise InvalidInput(f"--out {out} is a directory; name a file", fields={"path": out})
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InvalidInput(
                f"cannot write {target}: {exc.strerror or exc}", fields={"path": out}
            ) from None
        typer.echo(f"wrote {target} ({max(text.count(chr(10)) - 1, 0)} jobs)", err=True)
    if left_out:
        typer.echo(f"note: {left_out} jobs never completed a run in the window: left out", err=True)


def register(app: typer.Typer) -> None:
    app.command(name="whatif")(whatif)
    app.add_typer(history, name="history")
