"""``allot synth``: write synthetic workloads (a trace and its cluster) for ``allot sim``.

``allot synth gang-heavy --out DIR`` writes ``DIR/trace.csv`` and ``DIR/cluster.yaml``
(the model is in :mod:`allotment.sim.synthetic`). A directory that holds anything is
refused unless ``--force`` is given; then only those two files are replaced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from allotment.cli.common import Output, OutputOption, print_json
from allotment.domain.errors import InvalidInput
from allotment.sim.synthetic import GangHeavy, cluster_yaml, gang_heavy, summary, trace_csv

TRACE_FILE = "trace.csv"
CLUSTER_FILE = "cluster.yaml"
DEFAULTS = GangHeavy()

app = typer.Typer(
    help="Synthetic workloads for allot sim: a trace and its cluster.", no_args_is_help=True
)


def output_directory(path: str, *, force: bool) -> Path:
    """The directory to write into (not created yet); raises :class:`InvalidInput` for a
    file, or a directory that holds anything without ``force``."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise InvalidInput(f"--out {path}: not a directory", fields={"path": path})
    if target.is_dir() and any(target.iterdir()) and not force:
        raise InvalidInput(
            f"--out {path} is not empty; give --force to replace its {TRACE_FILE} and "
            f"{CLUSTER_FILE}",
            fields={"path": path},
        )
    return target


@app.command("gang-heavy")
def gang_heavy_command(
    out: Annotated[
        str, typer.Option("--out", metavar="DIR", help="Write trace.csv and cluster.yaml here.")
    ],
    load: Annotated[
        float, typer.Option("--load", help="Target offered load, (0, 2]; 0.80-0.95 is typical.")
    ] = DEFAULTS.load,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = DEFAULTS.seed,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes in the fleet.")] = DEFAULTS.nodes,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", help="GPUs per node (a gang replica's GPUs).")
    ] = DEFAULTS.gpus_per_node,
    queues: Annotated[
        int, typer.Option("--queues", help="Leaf queues, with unequal quotas (weights Q..1).")
    ] = DEFAULTS.queues,
    days: Annotated[
        float, typer.Option("--days", help="Span of arrivals, in days.")
    ] = DEFAULTS.days,
    gang_share: Annotated[
        float,
        typer.Option("--gang-share", help="Fraction of the GPU-time in gangs of 2-8 nodes."),
    ] = DEFAULTS.gang_share,
    burst: Annotated[
        float,
        typer.Option(
            "--burst",
            help="Amplitude of each queue's daily arrival cycle, 0-1 (the queues peak at "
            "different times).",
        ),
    ] = DEFAULTS.burst,
    limit_share: Annotated[
        float,
        typer.Option("--limit-share", help="Fraction of the jobs that declare max_runtime."),
    ] = DEFAULTS.limit_share,
    force: Annotated[
        bool, typer.Option("--force", help="Write into a directory that is not empty.")
    ] = False,
    output: OutputOption = Output.TABLE,
) -> None:
    """Gangs of 2-8 nodes mixed with 1-4 GPU jobs, at a target offered load.

    The queues have unequal quotas and their arrivals burst at different times of day, so
    borrowing and reclaim matter. Writes DIR/trace.csv and DIR/cluster.yaml.
    """
    spec = GangHeavy(
        load=load,
        seed=seed,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        queues=queues,
        days=days,
        gang_share=gang_share,
        burst=burst,
        limit_share=limit_share,
    )
    spec.check()
    target = output_directory(out, force=force)
    workload = gang_heavy(spec)
    trace_path = target / TRACE_FILE
    cluster_path = target / CLUSTER_FILE
    try:
        target.mkdir(parents=True, exist_ok=True)
        trace_path.write_text(trace_csv(workload), encoding="utf-8")
        cluster_path.write_text(cluster_yaml(workload), encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            f"--out {out}: cannot write there: {exc.strerror or exc}", fields={"path": out}
        ) from None
    data = {"trace": str(trace_path), "cluster": str(cluster_path), **summary(workload)}
    if output is Output.JSON:
        print_json(data)
        return
    typer.echo(_report(data))


def _report(data: dict[str, Any]) -> str:
    queues = ", ".join(
        f"{name} {q['quota_gpus']} GPUs ({q['jobs']:,} jobs, {q['gangs']:,} gangs)"
        for name, q in data["queues"].items()
    )
    return "\n".join(
        [
            f"wrote {data['trace']}: {data['jobs']:,} jobs over {data['days']:g} days: "
            f"{data['gang_jobs']:,} gangs of 2-8 nodes, {data['small_jobs']:,} of 1-4 GPUs; "
            f"{data['with_max_runtime']:,} declare max_runtime",
            f"  offered load {data['offered_load']:.3f} (target {data['target_load']:g}), "
            f"{data['gpu_hours']:,} GPU-hours, {data['gang_share']:.1%} of them in gangs "
            f"(target {data['target_gang_share']:.1%})",
            f"wrote {data['cluster']}: {data['nodes']} nodes x {data['gpus_per_node']} GPUs; "
            f"queues {queues}",
            f"replay: allot sim {data['trace']} -f {data['cluster']} -p borrowing -p default",
        ]
    )


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="synth")
