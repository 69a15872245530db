"""How the CLI reports an error: ``error: <message>`` on stderr."""

from __future__ import annotations

import typer


def print_error(message: str) -> None:
    typer.secho("error: ", fg=typer.colors.RED, bold=True, err=True, nl=False)
    typer.echo(message, err=True)
