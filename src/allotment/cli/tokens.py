"""``allot token``: issue, list and revoke API tokens, through :mod:`allotment.client`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.table import Table

from allotment.cli.common import Output, OutputOption, console, print_json
from allotment.cli.live import TokenOption, UrlOption, connect
from allotment.cli.live_render import fitted_table, when

app = typer.Typer(help="API tokens: issue, list, revoke.", no_args_is_help=True)


def tokens_table(tokens: Iterable[Mapping[str, Any]]) -> Table:
    rows = [
        [
            t["id"],
            t["user"],
            t.get("tenant") or "(platform)",
            t["role"],
            when(t.get("created_at")),
            when(t["expires_at"]) if t.get("expires_at") else "never",
            when(t["revoked_at"]) if t.get("revoked_at") else "",
            t.get("created_by", ""),
        ]
        for t in tokens
    ]
    headers = ("id", "user", "tenant", "role", "created", "expires", "revoked", "by")
    return fitted_table(headers, rows)


@app.command()
def create(
    user: Annotated[str, typer.Option("--user", "-u", help="Who the token speaks for.")],
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="The tenant; none: a platform token.")
    ] = None,
    role: Annotated[
        str | None,
        typer.Option("--role", "-r", help="admin, member or viewer; default: the member's."),
    ] = None,
    expires: Annotated[
        str | None, typer.Option("--expires", help="Lifetime, e.g. 30d or 12h; default never.")
    ] = None,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Issue a token; prints it once (keep it: only its digest is stored)."""
    with connect(url, token) as client:
        issued = client.create_token(user=user, tenant=tenant, role=role, expires_in=expires)
    if output is Output.JSON:
        print_json(issued)
        return
    typer.echo(issued["token"])
    scope = f"tenant {issued['tenant']}" if issued.get("tenant") else "the platform"
    expiry = when(issued["expires_at"]) if issued.get("expires_at") else "never"
    typer.echo(
        f"token {issued['id']}: {issued['user']}, {issued['role']} of {scope}, expires {expiry}; "
        "it is shown only now",
        err=True,
    )


@app.command(name="ls")
def list_tokens(
    output: OutputOption = Output.TABLE, url: UrlOption = None, token: TokenOption = None
) -> None:
    """The tokens you may manage (never their text)."""
    with connect(url, token) as client:
        tokens = client.tokens()
    if output is Output.JSON:
        print_json(tokens)
    else:
        console().print(tokens_table(tokens))


@app.command()
def revoke(
    token_id: Annotated[str, typer.Argument(help="The token id (t-…).")],
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Revoke a token: requests with it are refused from now on."""
    with connect(url, token) as client:
        revoked = client.revoke_token(token_id)
    if output is Output.JSON:
        print_json(revoked)
    else:
        typer.echo(f"{revoked['id']}: revoked")


def register(root: typer.Typer) -> None:
    """Add ``allot token`` to ``root``."""
    root.add_typer(app, name="token")
