"""Inputs that once made the API answer 5xx (or the CLI crash): each is a clear 4xx
``{code, message, fields}`` that says what to change, and nothing is stored."""

from __future__ import annotations

import json

import pytest

from allotment.api.explain import iso_utc
from allotment.client import AllotmentClient, ClientError
from allotment.domain.durations import format_duration

JOB = """\
name: {name}
queue: default
replicas:
  - {{name: worker, count: 1, resources: {{gpu: 2}}}}
command: [python, train.py]
"""


def job(name: str = "train", extra: str = "") -> str:
    return JOB.format(name=name) + extra


def refused(client: AllotmentClient, text: str) -> ClientError:
    with pytest.raises(ClientError) as caught:
        client.submit(text)
    assert 400 <= caught.value.status < 500, caught.value
    assert client.list_jobs()["jobs"] == []  # no partial state
    return caught.value


@pytest.mark.parametrize(
    "extra",
    [
        "max_runtime: 3000000d\n",
        "expected_runtime: 3651d\n",
        "max_runtime: 999999999999999999999\n",
        "retry: {max_attempts: 2, backoff: 100000d}\n",
    ],
)
def test_fault_a_duration_over_ten_years_is_a_422(client: AllotmentClient, extra: str) -> None:
    err = refused(client, job(extra=extra))
    assert err.status == 422 and err.code == "invalid_config"
    assert "at most 3650d" in err.message and "line 6" in err.message


def test_fault_why_behind_a_job_of_ten_years_answers(client: AllotmentClient) -> None:
    first = client.submit(job("long", "max_runtime: 3650d\n"))
    second = client.submit(job("next"))
    assert client.why(first["id"])["state"] == "pending"
    why = client.why(second["id"])
    assert why["job"] == second["id"]


@pytest.mark.parametrize("seconds", [1e300, float("inf"), float("-inf"), float("nan"), -1e300])
def test_fault_estimates_of_any_float_format_without_overflow(seconds: float) -> None:
    assert iso_utc(seconds) is None
    assert isinstance(format_duration(seconds), str)


SPEC = {
    "name": "rocket \U0001f680",
    "queue": "default",
    "replicas": [{"name": "worker", "count": 1, "resources": {"gpu": 1}}],
    "command": ["echo", "launch \U0001f680"],
}


def test_fault_a_json_spec_with_escaped_emoji_is_read_as_json(client: AllotmentClient) -> None:
    text = json.dumps(SPEC)  # ensure_ascii: the emoji as "\ud83d\ude80"
    assert "\\ud83d\\ude80" in text
    submitted = client.submit(text)
    assert submitted["name"] == "rocket \U0001f680"
    assert client.get_job(submitted["id"])["name"] == "rocket \U0001f680"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (json.dumps({**SPEC, "name": "half \ud83d"}), "surrogate"),
        (json.dumps({**SPEC, "name": "nul \x00"}), "NUL"),
        (json.dumps({**SPEC, "max_runtmie": "1h"}, indent=2), "max_runtmie"),
    ],
)
def test_fault_a_bad_json_spec_is_a_422_naming_the_field(
    client: AllotmentClient, text: str, said: str
) -> None:
    err = refused(client, text)
    assert err.status == 422 and err.code == "invalid_config"
    assert said in err.message


def test_fault_yaml_errors_keep_their_line_numbers(client: AllotmentClient) -> None:
    err = refused(client, job(extra="max_runtmie: 2h\n"))
    assert "line 6" in err.message
    err = refused(client, json.dumps(SPEC | {"max_runtmie": "1h"}).replace("\\ud83d\\ude80", ""))
    assert "max_runtmie" in err.message and "line 1" in err.message


@pytest.mark.parametrize(
    "name", ['"evil\\e[2J\\e[31mred"', '"two\\nlines"', '"bell\\a"', '"nul\\0"', '"rtl\\u202e"']
)
def test_fault_a_job_name_with_control_characters_is_a_422(
    client: AllotmentClient, name: str
) -> None:
    err = refused(client, job(name=name))
    assert err.status == 422 and err.code == "invalid_config"
    assert "line 1: name:" in err.message
    assert "control characters" in err.message or "NUL" in err.message


def replicas(group: str) -> str:
    return f"name: t\nqueue: default\nreplicas:\n  - {group}\ncommand: [python, train.py]\n"


@pytest.mark.parametrize(
    ("group", "said"),
    [
        ("{name: w, count: 1, resources: {gpu: 1.5}}", "gpu 1.5 is not possible"),
        ("{name: w, count: 1, resources: {gpu: 2.25}}", "whole GPUs"),
        ("{name: w, count: true, resources: {gpu: 1}}", "not the boolean true"),
        ("{name: w, count: false, resources: {gpu: 1}}", "not the boolean false"),
    ],
)
def test_fault_fractional_gpus_above_one_and_boolean_counts_are_a_422(
    client: AllotmentClient, group: str, said: str
) -> None:
    err = refused(client, replicas(group))
    assert err.status == 422 and err.code == "invalid_config"
    assert said in err.message and "line 4" in err.message


@pytest.mark.parametrize("gpu", ["0.5", "0.25", "1", "2"])
def test_fault_a_share_of_one_gpu_or_whole_gpus_are_accepted(
    client: AllotmentClient, gpu: str
) -> None:
    # One replica: the example cluster has one node of two GPUs.
    submitted = client.submit(replicas(f"{{name: w, count: 1, resources: {{gpu: {gpu}}}}}"))
    assert submitted["state"] == "pending"


def test_fault_a_boolean_service_port_is_a_422(client: AllotmentClient) -> None:
    service = "type: service\nservice: {port: true}\n"
    err = refused(client, replicas("{name: w, resources: {gpu: 1}}") + service)
    assert "port" in err.message and "boolean" in err.message


@pytest.mark.parametrize(
    ("group", "said"),
    [
        (
            "{name: w, count: 3, resources: {gpu: 1}}",
            "the job's 3 replicas can never all run at once on the nodes of pool local",
        ),
        ("{name: w, count: 1, resources: {gpu: 4}}", "more than any node of pool local has"),
        ("{name: w, count: 1, resources: {cpu: 9}}", "asks for 9 cpu"),
    ],
)
def test_fault_a_job_that_could_never_fit_the_fleet_is_a_422_naming_the_largest_node(
    client: AllotmentClient, group: str, said: str
) -> None:
    err = refused(client, replicas(group))
    assert err.status == 422 and said in err.message, err.message
    assert "the largest node, localhost, has 8 cpu, 2 gpu, 16Gi memory" in err.message


def test_fault_a_service_file_submitted_as_a_job_is_a_422_naming_the_services_route(
    client: AllotmentClient,
) -> None:
    err = refused(client, replicas("{name: w, resources: {gpu: 1}}") + "type: service\n")
    assert err.status == 422 and "POST /api/v1/services" in err.message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (replicas("{name: w, resources: {gpu: 1}}"), "needs type: service"),
        (
            replicas("{name: w, count: 2, resources: {gpu: 1}}") + "type: service\n",
            "describes one replica",
        ),
        (
            replicas("{name: w, resources: {gpu: 1}}")
            + "type: service\nservice: {replicas: {min: 3, max: 1}}\n",
            "replicas.min (3) must not exceed replicas.max (1)",
        ),
        (replicas("{name: w, resources: {gpu: 1}}").replace("default", "nope"), "nope"),
    ],
)
def test_fault_a_bad_service_file_is_a_4xx_and_stores_nothing(
    client: AllotmentClient, text: str, said: str
) -> None:
    with pytest.raises(ClientError) as caught:
        client.apply_service(text)
    assert 400 <= caught.value.status < 500 and said in caught.value.message
    assert client.services() == [] and client.list_jobs()["jobs"] == []


def test_fault_a_notebook_without_jupyterlab_beside_the_server_is_a_422(
    client: AllotmentClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "jupyterlab" else real(name, *args),
    )
    notebook = "name: nb\nqueue: default\ntype: notebook\nreplicas: [{resources: {gpu: 1}}]\n"
    err = refused(client, notebook)
    assert (
        err.status == 422 and "JupyterLab" in err.message and "allotment[notebook]" in err.message
    )
    # With a command of its own (or an image) it is accepted.
    accepted = client.submit(notebook + "command: [python, -m, http.server]\n")
    assert accepted["endpoint"] == f"/nb/{accepted['id']}/"
    assert accepted["spec"]["env"]["PORT"].isdigit() and accepted["spec"]["env"]["JUPYTER_TOKEN"]
