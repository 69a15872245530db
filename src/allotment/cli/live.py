"""The CLI commands that talk to a running server, only through :mod:`allotment.client`.

Every command takes ``-o json`` (JSON only on stdout) and ``--url``/``--token`` (else
:func:`allotment.clientconfig.load_client_config`). A :class:`ClientError` prints
``error: <message>`` and its fields on stderr and exits 1; an unreachable server says how
to start one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import RenderableType

from allotment.cli import live_render as render
from allotment.cli.common import Output, OutputOption, console, print_error, print_json
from allotment.client import AllotmentClient, ClientError
from allotment.clientconfig import ENV_URL, load_client_config
from allotment.domain.errors import InvalidInput

ACTIVE_STATES = ("admitted", "starting", "running")


class Stream(StrEnum):
    OUT = "out"
    ERR = "err"


UrlOption = Annotated[
    str | None,
    typer.Option("--url", help=f"Server URL; default ${ENV_URL}, else the config of `allot up`."),
]
TokenOption = Annotated[
    str | None, typer.Option("--token", help="API token; default $ALLOT_TOKEN, else the config.")
]
JobArgument = Annotated[str, typer.Argument(help="The job id.")]


def _fail(message: str, fields: dict[str, Any] | None = None) -> None:
    print_error(message)
    for key, value in (fields or {}).items():
        if value in (None, [], {}, "") or key in ("issues", "source"):
            continue  # issues are in the message already
        shown = ", ".join(str(v) for v in value) if isinstance(value, list) else value
        typer.echo(f"  {key}: {shown}", err=True)


@contextmanager
def connect(url: str | None, token: str | None) -> Iterator[AllotmentClient]:
    """A client for the chosen server; turns every ClientError into a clean exit 1."""
    found_url, found_token = load_client_config()
    base = url or found_url
    client = AllotmentClient(base, token if token is not None else found_token)
    try:
        yield client
    except ClientError as exc:
        if exc.code == "unreachable":
            _fail(
                f"cannot reach the Allotment server at {base} ({exc.message}); start one "
                f"with `allot up`, or point ${ENV_URL} or --url at a running one"
            )
        else:
            _fail(exc.message, exc.fields)
        raise typer.Exit(1) from None
    finally:
        client.close()


def _show(
    url: str | None,
    token: str | None,
    output: Output,
    fetch: Callable[[AllotmentClient], Any],
    view: Callable[[Any], RenderableType],
) -> None:
    """Fetch with a client, then print the JSON or the human view."""
    with connect(url, token) as client:
        data = fetch(client)
    if output is Output.JSON:
        print_json(data)
    else:
        console().print(view(data))


def read_text(path: str) -> str:
    """The text of the file ``path``; :class:`InvalidInput` naming it when it cannot be read."""
    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"{path}: no such file", fields={"path": path})
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}", fields={"path": path}) from exc


# ---------------------------------------------------------------- commands


def apply(
    file: Annotated[str, typer.Option("--file", "-f", help="The cluster file (cluster.yaml).")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only validate and show the differences.")
    ] = False,
    whatif: Annotated[
        bool,
        typer.Option(
            "--whatif",
            help="With --dry-run: also replay recorded history (--since, default the last "
            "day) under this file and under the configuration in force, side by side.",
        ),
    ] = False,
    since: Annotated[
        str, typer.Option("--since", help="With --whatif: the history to replay.")
    ] = "1d",
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Create or update pools, nodes, tenants, queues and priority classes."""
    if whatif and not dry_run:
        raise InvalidInput("--whatif compares before applying: give it with --dry-run")
    text = read_text(file)
    with connect(url, token) as client:
        result = client.apply_cluster(text, dry_run=dry_run)
        comparison = client.whatif(text, since=since) if whatif else None
    if output is Output.JSON:
        print_json(result if comparison is None else {**result, "whatif": comparison})
        return
    console().print(render.diff_view(result))
    if comparison is not None:
        from allotment.cli.whatif import comparison_view

        console().print(comparison_view(comparison))


def submit(
    file: Annotated[str, typer.Argument(help="The job file (job.yaml).")],
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Submit a job file; prints the job id. A ``type: service`` file creates the service
    (or updates the one of its name) and prints its URL."""
    text = read_text(file)
    with connect(url, token) as client:
        if _is_service(text):
            service = client.apply_service(text)
            if output is Output.JSON:
                print_json(service)
            else:
                typer.echo(f"service {service['tenant']}/{service['name']}: {service['url']}")
            return
        job = client.submit(text)
    if output is Output.JSON:
        print_json(job)
    else:
        typer.echo(job["id"])


def _is_service(text: str) -> bool:
    """Whether a job file says ``type: service`` (the server checks the rest)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return False  # the server names the line
    return isinstance(data, dict) and data.get("type") == "service"


def run(
    command: Annotated[list[str], typer.Argument(help="The command, after --.")],
    queue: Annotated[str, typer.Option("--queue", "-q", help="The leaf queue.")] = "default",
    gpus: Annotated[float, typer.Option("--gpus", "-g", min=0, help="GPUs per replica.")] = 1,
    pool: Annotated[
        list[str] | None, typer.Option("--pool", "-p", help="Acceptable pool (repeatable).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Job name.")] = None,
    priority_class: Annotated[
        str | None, typer.Option("--priority-class", help="Priority class.")
    ] = None,
    max_runtime: Annotated[
        str | None, typer.Option("--max-runtime", help="Time limit, e.g. 2h.")
    ] = None,
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="Replica count.")] = 1,
    cpu: Annotated[str | None, typer.Option("--cpu", help="CPU per replica.")] = None,
    memory: Annotated[str | None, typer.Option("--memory", help="Memory per replica.")] = None,
    image: Annotated[
        str | None, typer.Option("--image", help="Container image (container runtimes).")
    ] = None,
    mount: Annotated[
        list[str] | None,
        typer.Option("--mount", help="SOURCE:TARGET[:rw] (read-only unless :rw; repeatable)."),
    ] = None,
    network: Annotated[
        bool, typer.Option("--network", help="Ask for the network (the queue must allow it).")
    ] = False,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Submit a command as a job: allot run --gpus 1 -- python train.py; prints the id."""
    resources = replica_resources(gpus, cpu, memory)
    spec: dict[str, Any] = {
        "name": name or Path(command[0]).name[:128] or "job",
        "queue": queue,
        "replicas": [{"name": "worker", "count": replicas, "resources": resources}],
        "command": command,
    }
    if pool:
        spec["pools"] = pool
    if priority_class is not None:
        spec["priority_class"] = priority_class
    if max_runtime is not None:
        spec["max_runtime"] = max_runtime
    if image is not None:
        spec["image"] = image
    if mount:
        spec["mounts"] = [_mount(text) for text in mount]
    if network:
        spec["network"] = True
    with connect(url, token) as client:
        job = client.submit(json.dumps(spec))
    if output is Output.JSON:
        print_json(job)
    else:
        typer.echo(job["id"])


def replica_resources(gpus: float, cpu: str | None, memory: str | None) -> dict[str, Any]:
    """One replica's ``resources`` from the ``--gpus``, ``--cpu`` and ``--memory`` options."""
    resources: dict[str, Any] = {"gpu": int(gpus) if gpus == int(gpus) else gpus}
    if cpu is not None:
        resources["cpu"] = cpu
    if memory is not None:
        resources["memory"] = memory
    return resources


def _mount(text: str) -> dict[str, Any]:
    """``SOURCE:TARGET`` or ``SOURCE:TARGET:rw|ro`` as a job's mount."""
    parts = text.split(":")
    mode = "ro"
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        mode = parts.pop()
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise typer.BadParameter(
            f"{text!r}: write SOURCE:TARGET or SOURCE:TARGET:rw", param_hint="--mount"
        )
    return {"source": parts[0], "target": parts[1], "read_only": mode == "ro"}


def ls(
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Only this state (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="At most.")] = 100,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List jobs, oldest first."""
    with connect(url, token) as client:
        page = client.list_jobs(queue=queue, states=state, limit=limit)
    if output is Output.JSON:
        print_json(page)
    else:
        console().print(render.jobs_table(page["jobs"]))
        if page.get("next_after"):
            typer.echo(f"(more: raise --limit above {limit})", err=True)


def get(
    job: JobArgument,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Show one job (a notebook with the URL it opens at)."""

    def fetch(client: AllotmentClient) -> dict[str, Any]:
        found = client.get_job(job)
        address = render.notebook_url(client.server_url, found)
        return {**found, "url": address} if address else found

    _show(url, token, output, fetch, render.job_view)


def events(
    job: JobArgument,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """A job's lifecycle, oldest first."""
    _show(url, token, output, lambda c: c.events(job), lambda data: render.events_table(job, data))


def why(
    job: JobArgument,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Why a job waits: reason, position, estimated start, what holds the resources."""
    _show(url, token, output, lambda c: c.why(job), render.why_view)


def logs(
    job: JobArgument,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Wait for more.")] = False,
    replica: Annotated[
        str | None, typer.Option("--replica", "-r", help="e.g. worker-0 (default: the first).")
    ] = None,
    stream: Annotated[Stream, typer.Option("--stream", help="out or err.")] = Stream.OUT,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="Default: the latest.")
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, help="Seconds between polls with -f.")
    ] = 1.0,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print a replica's output; with -f keep printing until the attempt ends."""
    offset = 0
    chunks: list[dict[str, Any]] = []
    with connect(url, token) as client:
        try:
            while True:
                chunk = client.logs(
                    job, replica=replica, stream=stream.value, offset=offset, attempt=attempt
                )
                if chunk["attempt"] and attempt is None:
                    attempt = chunk["attempt"]  # stay on it while following
                if chunk["replica"] and replica is None:
                    replica = chunk["replica"]
                if output is Output.JSON:
                    chunks.append(chunk)
                elif chunk["data"]:
                    typer.echo(chunk["data"], nl=False)
                moved = chunk["next_offset"] != offset
                offset = chunk["next_offset"]
                if chunk["eof"] or (not follow and not moved):
                    break
                if not moved:
                    time.sleep(interval)
        except KeyboardInterrupt:
            pass
    if output is Output.JSON:
        data = "".join(c["data"] for c in chunks)
        last = chunks[-1] if chunks else {}
        print_json({**last, "offset": 0, "data": data})


def cancel(
    job: JobArgument,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel a job."""
    with connect(url, token) as client:
        data = client.cancel(job)
    if output is Output.JSON:
        print_json(data)
    else:
        typer.echo(f"{data.get('id', job)}: {data.get('state', 'cancel requested')}")


def queues(
    output: OutputOption = Output.TABLE, url: UrlOption = None, token: TokenOption = None
) -> None:
    """The quota tree with usage and borrowing."""
    _show(url, token, output, lambda c: c.queues(), render.queues_tree)


def pools(
    output: OutputOption = Output.TABLE, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Pools with their GPUs: capacity, allocated, free."""
    _show(url, token, output, lambda c: c.pools(), render.pools_table)


def nodes(
    output: OutputOption = Output.TABLE, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Nodes with capacity, what is free and the jobs on them."""
    _show(url, token, output, lambda c: c.nodes(), render.nodes_table)


def images(
    output: OutputOption = Output.TABLE, url: UrlOption = None, token: TokenOption = None
) -> None:
    """Container images on the nodes (only those your tenant may run) and what the
    runtime enforces."""
    _show(url, token, output, lambda c: c.images(), render.images_view)


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds.")] = 2.0,
    output: OutputOption = Output.TABLE,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """A live view of the queues and the running jobs (Ctrl-C to leave)."""
    from rich.live import Live

    with connect(url, token) as client:

        def frame() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            tree = client.queues()
            page = client.list_jobs(states=ACTIVE_STATES, limit=500)
            jobs: list[dict[str, Any]] = page["jobs"]
            return tree, jobs

        if output is Output.JSON or once:
            tree, jobs = frame()
            if output is Output.JSON:
                print_json({"queues": tree, "jobs": jobs})
            else:
                console().print(render.top_view(tree, jobs))
            return
        try:
            with Live(render.top_view(*frame()), console=console(), screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(render.top_view(*frame()))
        except KeyboardInterrupt:
            pass


COMMANDS = (
    apply,
    submit,
    run,
    ls,
    get,
    events,
    why,
    logs,
    cancel,
    queues,
    pools,
    nodes,
    images,
    top,
)


def register(app: typer.Typer) -> None:
    """Add the live commands to ``app``."""
    for command in COMMANDS:
        app.command(name=command.__name__)(command)
