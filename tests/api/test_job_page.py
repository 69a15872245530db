"""A job's dashboard page over HTTP: the log of each replica, output or errors, chosen by
a shareable link and kept by the live part."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from allotment.api.auth import StoreTokens
from allotment.client import AllotmentClient
from allotment.domain.lifecycle import JobState
from allotment.domain.loading import load_cluster_text
from tests.api.live import Live, live_stack
from tests.api.tenancy import CLUSTER, issue

# Each replica says who it is on its output, and something else on its errors.
SAY = (
    "import os, sys; key = os.environ['ALLOTMENT_REPLICA_KEY'].rsplit('/', 1)[-1]; "
    "print('hello from', key, flush=True); print('trouble in', key, file=sys.stderr, "
    "flush=True)"
)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, str, str]]:
    root = tmp_path_factory.mktemp("jobpage")
    with live_stack(
        root,
        cluster=load_cluster_text(CLUSTER),
        authenticator=lambda sessions: StoreTokens(sessions, clock=time.time),
    ) as stack:
        token = issue(stack.sessions, "bob", "vision", "member")[1]
        spec = {
            "name": "two",
            "queue": "vision-q",
            "replicas": [{"name": "worker", "count": 2, "resources": {"gpu": 1, "cpu": 1}}],
            "command": [sys.executable, "-c", SAY],
        }
        with AllotmentClient(stack.url, token, timeout=20) as bob:
            job_id = bob.submit(json.dumps(spec))["id"]
        stack.until(job_id, {JobState.SUCCEEDED}, timeout=30)
        yield stack, token, job_id


def get(live: Live, token: str, path: str) -> str:
    answer = httpx.get(
        f"{live.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=20
    )
    assert answer.status_code == 200, answer.text[:300]
    return answer.text


def log(html: str) -> str:
    """The log shown on the page (empty when none is)."""
    found = re.search(r'<pre class="log" data-testid="log">(.*?)</pre>', html, re.S)
    return found.group(1) if found else ""


def test_the_page_links_every_replicas_output_and_errors(ran: tuple[Live, str, str]) -> None:
    live, token, job_id = ran
    html = get(live, token, f"/ui/jobs/{job_id}")
    assert log(html).strip() == "hello from worker-0"
    for name in ("worker-0", "worker-1"):
        for stream in ("out", "err"):
            assert f'href="/ui/jobs/{job_id}?replica={name}&amp;stream={stream}"' in html


def test_a_link_shows_that_replicas_stream_and_the_live_part_keeps_it(
    ran: tuple[Live, str, str],
) -> None:
    live, token, job_id = ran
    html = get(live, token, f"/ui/jobs/{job_id}?replica=worker-1&stream=err")
    assert log(html).strip() == "trouble in worker-1"
    assert f'hx-get="/ui/fragments/jobs/{job_id}?replica=worker-1&amp;stream=err"' in html
    fragment = get(live, token, f"/ui/fragments/jobs/{job_id}?replica=worker-1&stream=err")
    assert log(fragment).strip() == "trouble in worker-1"
    assert 'aria-current="true">worker-1 errors</a>' in fragment


def test_an_unknown_replica_shows_no_output_and_a_bad_name_is_refused(
    ran: tuple[Live, str, str],
) -> None:
    live, token, job_id = ran
    assert "no output yet" in get(live, token, f"/ui/jobs/{job_id}?replica=worker-9")
    answer = httpx.get(
        f"{live.url}/ui/jobs/{job_id}",
        params={"replica": "../etc"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=20,
    )
    assert answer.status_code == 422
