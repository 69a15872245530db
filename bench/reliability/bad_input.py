"""Requests a careless or hostile client sends: each must get a clear 4xx, never a 5xx,
and leave nothing stored."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx


def _job(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "bad",
        "queue": "default",
        "replicas": [{"count": 1, "resources": {"gpu": 1}}],
        "command": ["true"],
    }
    spec.update(changes)
    return {"spec": json.dumps(spec)}


@dataclass(frozen=True)
class Bad:
    """One request: what it is, and how it is sent."""

    what: str
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    anonymous: bool = False


BOMB = 'a: &a ["x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 8)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)
)

BAD_REQUESTS: tuple[Bad, ...] = (
    Bad("report since a microsecond after the epoch", "GET", "/report", params={"since": 1e-6}),
    Bad("report until far in the future", "GET", "/report", params={"until": 1e300}),
    Bad(
        "report over one microsecond", "GET", "/report", params={"since": 1e9, "until": 1e9 + 1e-6}
    ),
    Bad("report until before since", "GET", "/report", params={"since": 2e9, "until": 1e9}),
    Bad("max_runtime of 3,000,000 days", "POST", "/jobs", _job(max_runtime="3000000d")),
    Bad("retry back-off of 100,000 days", "POST", "/jobs", _job(retry={"backoff": "100000d"})),
    Bad("token for a user with a NUL", "POST", "/tokens", {"user": "a\x00b"}),
    Bad("token expiring in 1e308 s", "POST", "/tokens", {"user": "x", "expires_in": 1e308}),
    Bad("token expiring in -1 s", "POST", "/tokens", {"user": "x", "expires_in": -1}),
    Bad("job name with a terminal escape", "POST", "/jobs", _job(name="\x1b[31mred")),
    Bad("job name with a newline", "POST", "/jobs", _job(name="two\nlines")),
    Bad(
        "1.5 GPUs",
        "POST",
        "/jobs",
        _job(replicas=[{"count": 1, "resources": {"gpu": 1.5}}]),
    ),
    Bad("count: true", "POST", "/jobs", _job(replicas=[{"count": True}])),
    Bad("cpu: 0 and no GPU", "POST", "/jobs", _job(replicas=[{"resources": {"cpu": 0}}])),
    Bad(
        "20,000 replicas",
        "POST",
        "/jobs",
        _job(replicas=[{"name": f"g{i}", "count": 10_000} for i in range(2)]),
    ),
    Bad("an unknown queue", "POST", "/jobs", _job(queue="nope")),
    Bad("a negative GPU count", "POST", "/jobs", _job(replicas=[{"resources": {"gpu": -1}}])),
    Bad(
        "a NaN GPU count",
        "POST",
        "/jobs",
        {"spec": '{"name": "n", "queue": "default", "replicas": [{"resources": {"gpu": NaN}}]}'},
    ),
    Bad("a YAML alias bomb", "POST", "/jobs", {"spec": BOMB}),
    Bad("a spec that is not a mapping", "POST", "/jobs", {"spec": "- just\n- a list\n"}),
    Bad("a body that is not JSON", "POST", "/jobs", content=b"{not json"),
    Bad("an empty batch", "POST", "/jobs:batch", {"specs": []}),
    Bad(
        "an idempotency key of 10,000 characters",
        "POST",
        "/jobs",
        _job(),
        headers={"Idempotency-Key": "k" * 10_000},
    ),
    Bad("a job that does not exist", "GET", "/jobs/j-0000000000000000"),
    Bad("cancel a job that does not exist", "POST", "/jobs/j-0000000000000000/cancel"),
    Bad("a page of a billion jobs", "GET", "/jobs", params={"limit": 10**9}),
    Bad("an unknown state", "GET", "/jobs", params={"state": "exploded"}),
    Bad(
        "logs of attempt 10^20", "GET", "/jobs/j-0000000000000000/logs", params={"attempt": 10**20}
    ),
    Bad("a cluster file that is not YAML", "PUT", "/cluster", {"text": "pools: [\n"}),
    Bad("a cluster file with an unknown key", "PUT", "/cluster", {"text": "poolz: []\n"}),
    Bad("alerts since NaN", "GET", "/alerts", params={"since": "nan"}),
    Bad("a made-up bearer token", "GET", "/jobs", headers={"Authorization": "Bearer nope"}),
    Bad("no token at all", "POST", "/jobs", _job(), anonymous=True),
)
"""Every input the campaigns found answered with a 5xx, a traceback or a stored job once,
and their neighbours."""


@dataclass
class Answer:
    bad: Bad
    status: int
    body: str


def send_all(base_url: str, token: str) -> list[Answer]:
    """Send every request of :data:`BAD_REQUESTS`; what each got back."""
    answers = []
    with httpx.Client(base_url=f"{base_url}/api/v1", timeout=30) as http:
        for bad in BAD_REQUESTS:
            headers = {} if bad.anonymous else {"Authorization": f"Bearer {token}"}
            headers.update(bad.headers)
            response = http.request(
                bad.method,
                bad.path,
                json=bad.json,
                params=bad.params,
                headers=headers,
                content=bad.content,
            )
            answers.append(Answer(bad, response.status_code, response.text[:300]))
    return answers
