"""``allot``: the command line.

Every :class:`AllotmentError` a command raises becomes ``error: <message>`` on stderr and
exit status 1 (one handler, in :class:`_Commands`); usage mistakes exit 2; human output
is Rich tables, ``-o json`` prints JSON on stdout.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from allotment.cli import alerts, audit, live, report, services, synth, tokens, up, whatif
from allotment.cli.common import Output, OutputOption, print_error, print_json
from allotment.cli.common import console as make_console
from allotment.domain.errors import AllotmentError, ConfigError, InvalidInput
from allotment.domain.isolation import check_execution
from allotment.domain.loading import check_job, load_cluster, load_job
from allotment.domain.tenancy import DEFAULT_TENANT


class _Commands(TyperGroup):
    """The command group, with the one error handler."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except AllotmentError as exc:
            print_error(exc.message)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_Commands,
    name="allot",
    help="Allotment: queues, quotas and priorities for a shared GPU fleet.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.command()
def check(
    jobs: Annotated[
        list[str] | None, typer.Argument(help="Job files to check against the cluster.")
    ] = None,
    cluster_file: Annotated[
        str | None, typer.Option("--file", "-f", help="The cluster file (cluster.yaml).")
    ] = None,
    output: OutputOption = Output.TABLE,
) -> None:
    """Validate a cluster file and job files without changing anything."""
    from allotment.cli import render

    if cluster_file is None and not jobs:
        raise InvalidInput("nothing to check: give -f cluster.yaml and/or job files")
    for path in [cluster_file, *(jobs or [])]:
        if path is not None and not Path(path).is_file():
            raise InvalidInput(f"{path}: no such file", fields={"path": path})
    cluster = load_cluster(cluster_file) if cluster_file is not None else None
    checked: list[dict[str, Any]] = []
    failures: list[str] = []
    for path in jobs or []:
        try:
            job = load_job(path)
            if cluster is not None:
                issues = check_job(job, cluster)
                if issues:
                    raise ConfigError(issues, source=path)
                queue = cluster.queues[job.queue]
                tenant = queue.tenant or DEFAULT_TENANT
                check_execution(job, cluster, queue, tenant, source=str(path))
        except AllotmentError as exc:
            failures.append(exc.message)
            continue
        checked.append(render.job_data(job, path))
    data: dict[str, Any] = {
        "cluster": render.cluster_data(cluster) if cluster is not None else None,
        "jobs": checked,
    }
    if output is Output.JSON:
        print_json({**data, "errors": failures})
    else:
        console = make_console()
        if cluster is not None and cluster_file is not None:
            console.print(render.cluster_view(data["cluster"], cluster_file))
        for entry in checked:
            console.print(
                f"[green]ok[/green] {entry['file']}: {entry['name']} -> queue {entry['queue']}, "
                f"{entry['replicas']} replica(s), {entry['gpus']} GPUs",
                markup=True,
            )
    if failures:
        for message in failures:
            print_error(message)
        raise typer.Exit(1)


@app.command()
def sim(
    trace: Annotated[
        str,
        typer.Argument(
            help="Trace CSV: generic (job_id, submit_time, duration, ...), a Philly window "
            "or an Alibaba openb pod list, told apart by the header."
        ),
    ],
    cluster_file: Annotated[
        str | None,
        typer.Option(
            "--file",
            "-f",
            help="Cluster file; default: for a Philly or Alibaba trace the cluster of its "
            "node file, else ./cluster.yaml.",
        ),
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option(
            "--nodes",
            help="Node file of a Philly or Alibaba trace; default: the one next to the trace.",
        ),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="Policy to replay (repeat to compare): fifo-isolated, borrowing, fair-share, "
            "backfill, default; combine with + (borrowing+backfill), add +oracle or "
            "+protect.",
        ),
    ] = None,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="Multiply submit times by this.")
    ] = 1.0,
    jitter_seed: Annotated[
        int | None,
        typer.Option(
            "--jitter-seed",
            min=0,
            help="Submit every job up to 1 s later (uniform, from this seed) before the "
            "time scale: replays of a few seeds show which differences are chance.",
        ),
    ] = None,
    predict_every: Annotated[
        int,
        typer.Option(
            "--predict-every",
            min=0,
            help="Forecast the start of every Nth job at its submission and report the "
            "error against its actual start (0: off).",
        ),
    ] = 0,
    jobs_out: Annotated[
        str | None,
        typer.Option(
            "--jobs-out",
            help="Write one CSV row per job attempt here (with several policies, "
            "NAME.POLICY.csv each).",
        ),
    ] = None,
    per_queue: Annotated[
        bool, typer.Option("--per-queue", help="Also print a table per queue.")
    ] = False,
    plot: Annotated[
        str | None,
        typer.Option(
            "--plot",
            metavar="DIR",
            help="Write charts into DIR: utilization.png, wait_cdf.png, queue_share.png.",
        ),
    ] = None,
    output: OutputOption = Output.TABLE,
) -> None:
    """Replay a trace on the real scheduler with a virtual clock and compare policies."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from allotment.cli import render
    from allotment.sim.jobs_out import write_jobs_out
    from allotment.sim.metrics import summarize
    from allotment.sim.plots import plot_directory, write_plots
    from allotment.sim.policies import parse_policy
    from allotment.sim.replay import Replay
    from allotment.sim.results import ReplayResult
    from allotment.sim.trace import check_trace, jittered
    from allotment.sim.trace_formats import load_trace

    names = policy or ["default"]
    policies = [parse_policy(name) for name in names]
    if len({p.name for p in policies}) != len(policies):
        raise InvalidInput("the same policy is given twice")
    if not (time_scale >= 0 and time_scale != float("inf")):
        raise InvalidInput(f"--time-scale must be a finite number >= 0, got {time_scale}")
    if cluster_file is not None and nodes is not None:
        raise InvalidInput("give a cluster file (-f) or a node file (--nodes), not both")
    where = None if cluster_file is None else _cluster_path(cluster_file)
    if not Path(trace).is_file():
        raise InvalidInput(f"trace {trace}: no such file", fields={"path": trace})
    if nodes is not None and not Path(nodes).is_file():
        raise InvalidInput(f"node file {nodes}: no such file", fields={"path": nodes})
    cluster = None if where is None else load_cluster(where)
    loaded = load_trace(trace, nodes=nodes, build_cluster=cluster is None)
    if cluster is None and loaded.cluster is not None:
        cluster, where = loaded.cluster, f"the cluster of {loaded.nodes_file}"
    elif cluster is None:
        # A generic trace, or a real one without its node file: ./cluster.yaml.
        if loaded.format.nodes_file is not None and not Path("cluster.yaml").is_file():
            raise InvalidInput(
                f"no cluster for this {loaded.format.name} trace: put "
                f"{loaded.format.nodes_file} next to it, or give --nodes FILE or -f cluster.yaml"
            )
        where = _cluster_path(None)
        cluster = load_cluster(where)
    jobs = loaded.jobs
    if jitter_seed is not None:
        jobs = jittered(jobs, jitter_seed)
    check_trace(jobs, cluster, source=trace)
    if loaded.note:
        typer.echo(f"note: {trace}: {loaded.note}", err=True)
    if plot is not None:
        plot_directory(Path(plot))
    err = Console(stderr=True, highlight=False)
    summaries: list[dict[str, Any]] = []
    written: list[str] = []
    results: list[tuple[str, ReplayResult]] = []
    for chosen in policies:
        if err.is_terminal:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            ) as bar:
                task = bar.add_task(f"replaying under {chosen.name}", total=len(jobs))
                result = Replay(
                    cluster,
                    jobs,
                    chosen,
                    time_scale=time_scale,
                    predict_every=predict_every,
                    progress=partial(_advance, bar, task),
                ).run()
        else:
            result = Replay(
                cluster, jobs, chosen, time_scale=time_scale, predict_every=predict_every
            ).run()
        summaries.append(summarize(result))
        if jitter_seed is not None:
            summaries[-1]["jitter_seed"] = jitter_seed
        if jobs_out is not None:
            target = _jobs_out_path(jobs_out, chosen.name, several=len(policies) > 1)
            write_jobs_out(result.attempts, target)
            written.append(str(target))
        if plot is not None:
            results.append((chosen.name, result))
    if plot is not None:
        written.extend(str(path) for path in write_plots(results, cluster, Path(plot)))
    if output is Output.JSON:
        print_json(summaries)
    else:
        console = make_console()
        title = f"{trace}: {len(jobs)} jobs on {where}"
        if time_scale != 1.0:
            title += f", submit times x {time_scale:g}"
        if jitter_seed is not None:
            title += f", jittered (seed {jitter_seed})"
        console.print(render.comparison_table(summaries, title))
        if per_queue:
            for summary in summaries:
                console.print(render.per_queue_table(summary))
    for path in written:
        typer.echo(f"wrote {path}", err=True)


@app.command()
def plan(
    jobs: Annotated[list[str], typer.Argument(help="Job files, submitted in this order.")],
    cluster_file: Annotated[
        str | None, typer.Option("--file", "-f", help="Cluster file; default ./cluster.yaml.")
    ] = None,
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="Scheduler policy (as for sim).")
    ] = "default",
    output: OutputOption = Output.TABLE,
) -> None:
    """Show what one scheduling cycle would do with these jobs on an empty cluster:
    where each would run, or why it would wait and when it would start."""
    import time

    from allotment.cli.plan import plan as make_plan
    from allotment.cli.plan import plan_table
    from allotment.sim.policies import parse_policy

    cluster = load_cluster(_cluster_path(cluster_file))
    specs = []
    for i, path in enumerate(jobs):
        spec = load_job(path)
        issues = check_job(spec, cluster)
        if issues:
            raise ConfigError(issues, source=path)
        specs.append((f"{i + 1}-{spec.name}", spec))
    rows = make_plan(cluster, specs, now=time.time(), policy=parse_policy(policy))
    if output is Output.JSON:
        print_json(rows)
    else:
        make_console().print(plan_table(rows))


def _advance(bar: Any, task: Any, done: int, total: int) -> None:
    bar.update(task, completed=done, total=total)


def _cluster_path(cluster_file: str | None) -> str:
    if cluster_file is None:
        if not Path("cluster.yaml").is_file():
            raise InvalidInput("no cluster file: give -f cluster.yaml")
        return "cluster.yaml"
    if not Path(cluster_file).is_file():
        raise InvalidInput(
            f"cluster file {cluster_file}: no such file", fields={"path": cluster_file}
        )
    return cluster_file


def _jobs_out_path(path: str, policy: str, *, several: bool) -> Path:
    target = Path(path)
    if not several:
        return target
    safe = "".join(c if c.isalnum() or c in "-_+" else "_" for c in policy)
    return target.with_name(f"{target.stem}.{safe}{target.suffix or '.csv'}")


up.register(app)
live.register(app)
services.register(app)
tokens.register(app)
audit.register(app)
report.register(app)
alerts.register(app)
synth.register(app)
whatif.register(app)


def main() -> None:
    """Entry point for ``python -m allotment.cli.main``."""
    app(prog_name="allot")


if __name__ == "__main__":
    main()
