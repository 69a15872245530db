"""``allot services``, ``allot delete-service`` and ``allot notebook``: inference
services and notebooks on a running server (``allot submit`` applies a ``type: service``
file)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.table import Table

from allotment.cli.common import Output, OutputOption, console, print_json
from allotment.cli.live import TokenOption, UrlOption, connect, replica_resources
from allotment.cli.live_render import ago, fitted_table, notebook_url, plain
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


def notebook(
    queue: Annotated[str, typer.Option("--queue", "-q", help="The leaf queue.")] = "default",
    gpus: Annotated[float, typer.Option("--gpus", "-g", min=0, help="GPUs.")] = 1,
    image: Annotated[
        str | None, typer.Option("--image", help="Container image with JupyterLab.")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="Job name.")] = "notebook",
    ttl: Annotated[str | None, typer.Option("--ttl", help="Time to live, e.g. 8h.")] = None,
    idle_timeout: Annotated[
        str | None, typer.Option("--idle-timeout", help="Reclaimed when idle this long.")
    ] = None,
    cpu: Annotated[str | None, typer.Option("--cpu", help="CPU.")] = None,
    memory: Annotated[str | None, typer.Option("--memory", help="Memory.")] = None,
    pool: Annotated[
        list[str] | None, typer.Option("--pool", "-p", help="Acceptable pool (repeatable).")
    ] = None,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Start a JupyterLab notebook as a job; prints its id and its URL."""
    resources = replica_resources(gpus, cpu, memory)
    settings = {k: v for k, v in (("ttl", ttl), ("idle_timeout", idle_timeout)) if v}
    spec: dict[str, Any] = {
        "name": name,
        "queue": queue,
        "type": "notebook",
        "replicas": [{"name": "lab", "count": 1, "resources": resources}],
        "notebook": settings,
    }
    if image is not None:
        spec["image"] = image
    if pool:
        spec["pools"] = pool
    with connect(url, token) as client:
        job = client.submit(json.dumps(spec))
        address = notebook_url(client.server_url, job)
    if output is Output.JSON:
        print_json({**job, "url": address})
    else:
        typer.echo(job["id"])
        typer.echo(f"open: {address}  (once it runs: allot get {job['id']})")


def register(app: typer.Typer) -> None:
    app.command(name="services")(services)
    app.command(name="delete-service")(delete_service)
    app.command(name="notebook")(notebook)
