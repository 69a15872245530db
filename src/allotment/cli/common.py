"""What every command shares: how errors and JSON are printed, the ``-o`` option."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


OutputOption = Annotated[
    Output, typer.Option("--output", "-o", help="table for people, json for programs.")
]


def print_error(message: str) -> None:
    """``error: <message>`` on stderr."""
    typer.secho("error: ", fg=typer.colors.RED, bold=True, err=True, nl=False)
    typer.echo(message, err=True)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


PIPED_WIDTH = 200
"""Columns when the output is not a terminal: whole lines for grep and files."""


def console() -> Console:
    """Where tables go: the terminal's width, or :data:`PIPED_WIDTH` when piped."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=PIPED_WIDTH)
