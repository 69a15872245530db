"""``X-Forwarded-For`` is believed only from configured proxies: otherwise any local
client could choose the address it is audited and rate-limited as."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import EXAMPLES, Up
from tests.server.conftest import up as up

SPEC = 'name: t\nqueue: default\ncommand: ["true"]\nreplicas: [{count: 1, resources: {gpu: 1}}]\n'


def audited_source(up: Up) -> str:
    headers = {
        "Authorization": f"Bearer {up.config['token']}",
        "X-Forwarded-For": "203.0.113.7",
    }
    answer = httpx.post(f"{up.url}/api/v1/jobs", json={"spec": SPEC}, headers=headers)
    assert answer.status_code == 201
    with up.client() as client:
        [record] = client.audit(action="job.submit")["records"]
    return str(record["source"])


@pytest.mark.parametrize(
    ("extra", "source"), [((), "127.0.0.1"), (("--trusted-proxy", "127.0.0.1"), "203.0.113.7")]
)
def test_fault_forwarded_for_is_believed_only_from_a_trusted_proxy(
    up: Up, extra: tuple[str, ...], source: str
) -> None:
    up.start("-f", str(EXAMPLES / "cluster-local.yaml"), *extra)
    assert audited_source(up) == source
