"""``allot services`` and ``allot delete-service``: inference services on a running
server (``allot submit`` applies a ``type: service`` file)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.table import Table

from allotment.cli.common import Output, OutputOption, console, print_json
from allotment.cli.live import TokenOption, UrlOption, connect
from allotment.cli.live_render import ago, fitted_table, plain
from allotment.client import AllotmentClient
from allotment.domain.errors import InvalidInput

NameArgument = Annotated[
    str, typer.Argument(help="The service: NAME, or TENANT/NAME when the name is not unique.")
]


def find(client: AllotmentClient, name: str) -> dict[str, Any]:
    """The service ``name`` (``TENANT/NAME`` or a name unique among those visible)."""
    tenant, _, short = name.rpartition("/")
    if tenant:
        return client.get_service(tenant, short)
    found = [s for s in client.services() if s["name"] == short]
    if not found:
        raise InvalidInput(f"no service named {short!r} is visible to you", fields={"name": short})
    if len(found) > 1:
        tenants = ", ".join(s["tenant"] for s in found)
        raise InvalidInput(
            f"services named {short!r} exist in tenants {tenants}: write TENANT/{short}",
            fields={"name": short},
        )
    return found[0]


def services_table(services: list[Mapping[str, Any]]) -> Table:
    rows = [
        [
            s["name"],
            s["tenant"],
            s["queue"],
            f"{s['ready']}/{s['desired']} ({s['min_replicas']}-{s['max_replicas']})",
            str(s["restarts"]),
            (s.get("reason") or {}).get("code", ""),
            ago(s.get("created_at")),
            s.get("url") or s["path"],
        ]
        for s in services
    ]
    headers = ("name", "tenant", "queue", "ready", "restarts", "status", "age", "url")
    return fitted_table(headers, rows, right=("restarts", "age"))


def service_view(service: Mapping[str, Any]) -> Table:
    table = Table(show_header=False, box=None, title=f"service {service['name']}")
    table.add_column(style="bold")
    table.add_column()
    reason = service.get("reason") or {}
    rows = [
        ("url", service.get("url") or service["path"]),
        ("tenant", service["tenant"]),
        ("queue", service["queue"]),
        ("priority class", service["priority_class"]),
        (
            "replicas",
            f"{service['ready']} ready of {service['desired']} wanted "
            f"(min {service['min_replicas']}, max {service['max_replicas']})",
        ),
        ("generation", str(service["generation"])),
        ("restarts", str(service["restarts"])),
        ("status", f"{reason.get('code', '')}: {reason.get('message', '')}"),
    ]
    for replica in service["replicas"]:
        ready = "ready" if replica["ready"] else "not ready"
        rows.append(
            (
                f"replica {replica['job']}",
                f"{replica['state']}, {ready} (gen {replica['generation']})",
            )
        )
    for key, value in rows:
        table.add_row(key, plain(value))
    return table


def services(
    name: Annotated[str | None, typer.Argument(help="One service (NAME or TENANT/NAME).")] = None,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List services with their URL and ready replicas, or show one."""
    with connect(url, token) as client:
        data: Any = client.services() if name is None else find(client, name)
    if output is Output.JSON:
        print_json(data)
    elif name is None:
        console().print(services_table(data))
    else:
        console().print(service_view(data))


def delete_service(
    name: NameArgument,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Stop every replica of a service and forget it."""
    with connect(url, token) as client:
        found = find(client, name)
        data = client.delete_service(found["tenant"], found["name"])
    if output is Output.JSON:
        print_json(data)
    else:
        typer.echo(f"service {data['tenant']}/{data['name']} deleted")


def register(app: typer.Typer) -> None:
    app.command(name="services")(services)
    app.command(name="delete-service")(delete_service)
