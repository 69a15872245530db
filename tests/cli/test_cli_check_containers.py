"""``allot check`` applies the runtime's rules offline: the container example passes;
an image on a plain-process cluster, or one outside the tenant's allow-list, is refused
with what to change."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from allotment.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()


def test_the_container_example_checks() -> None:
    result = runner.invoke(
        app,
        [
            "check",
            "-f",
            str(EXAMPLES / "cluster-containers.yaml"),
            str(EXAMPLES / "containers" / "ddp.yaml"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "ok " in result.stdout and "ddp -> queue vision-train" in result.stdout


def test_an_image_on_a_plain_process_cluster_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        'name: t\nqueue: default\nimage: localhost/x:1\ncommand: ["true"]\n'
        "replicas: [{count: 1, resources: {gpu: 1}}]\n"
    )
    result = runner.invoke(app, ["check", "-f", str(EXAMPLES / "cluster-local.yaml"), str(job)])
    assert result.exit_code == 1
    assert "plain processes" in result.stderr and "remove image" in result.stderr


def test_an_image_outside_the_allow_list_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        'name: t\nqueue: nlp-batch\nimage: localhost/vision/train:1\ncommand: ["true"]\n'
        "replicas: [{count: 1, resources: {gpu: 1}}]\n"
    )
    result = runner.invoke(
        app, ["check", "-f", str(EXAMPLES / "cluster-containers.yaml"), str(job)]
    )
    assert result.exit_code == 1
    assert "may not run image 'localhost/vision/train:1'" in result.stderr
    assert "localhost/nlp/*" in result.stderr
