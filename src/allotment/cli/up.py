"""``allot up``: the server, the control loop, the local executor and the dashboard."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from allotment.cli.common import print_error


def up(
    cluster_file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Apply this cluster file first (cluster.yaml)."),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="ALLOT_DB",
            help="Store URL, e.g. postgresql+psycopg://user@127.0.0.1/allotment "
            "(default: SQLite in the data directory). ALLOT_DB keeps a password in it "
            "off the command line, where other local users could read it.",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8642,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Store, logs and working directories (default: ~/.local/share/allotment).",
        ),
    ] = None,
    tick: Annotated[
        float, typer.Option(help="Seconds between scheduling cycles when idle.", min=0.05)
    ] = 1.0,
    stop_grace: Annotated[
        float,
        typer.Option(help="Seconds between SIGTERM and SIGKILL when stopping a job.", min=0),
    ] = 30.0,
    reconcile_every: Annotated[
        float,
        typer.Option(
            help="Seconds between reconciliations (zombies and orphans are found there).",
            min=0.1,
        ),
    ] = 30.0,
    scheduler_process: Annotated[
        bool | None,
        typer.Option(
            "--scheduler-process/--scheduler-thread",
            help="Run the scheduler (control loop, upkeep) in a process of its own, off "
            "the API's interpreter lock, or on a thread of the API's process (default: "
            "a process of its own where this process may use two cores or more).",
            show_default=False,
        ),
    ] = None,
    api_processes: Annotated[
        int,
        typer.Option(
            "--api-processes",
            help="Processes serving the API on the one port, for more requests a second "
            "than one process can take (the rate limit then applies in each).",
            min=1,
            max=64,
        ),
    ] = 1,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxy",
            help="Address of a reverse proxy whose X-Forwarded-For is believed "
            "(repeatable; none by default: the header is ignored).",
        ),
    ] = None,
) -> None:
    """Start Allotment on this machine and serve until Ctrl-C (jobs keep running)."""
    from allotment.server import (
        Server,
        ServerOptions,
        StartupError,
        default_data_dir,
        describe,
        spare_core,
    )

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    options = ServerOptions(
        data_dir=(data_dir or default_data_dir()).expanduser().resolve(),
        db_url=db,
        host=host,
        port=port,
        cluster_file=cluster_file,
        tick_s=tick,
        stop_grace_s=stop_grace,
        reconcile_every_s=reconcile_every,
        trusted_proxies=tuple(trusted_proxy or ()),
        scheduler_process=spare_core() if scheduler_process is None else scheduler_process,
        api_processes=api_processes,
    )
    server = Server(options)
    try:
        server.open()
    except StartupError as exc:
        server.close()
        print_error(str(exc))
        raise typer.Exit(1) from None
    except Exception:
        server.close()
        raise
    for line in describe(server):
        typer.echo(line, err=True)
    server.run()


def register(app: typer.Typer) -> None:
    app.command()(up)
