"""The dashboard in a real browser (headless Chromium), against ``allot up`` as a
process: sign in, the overview, a waiting job's reason, a job followed from pending to
succeeded without a reload, cancelling from the job's page, and a member of one tenant
who sees none of another tenant's jobs on any page."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from allotment.client import AllotmentClient
from allotment.web.report import csv_text
from tests.server.conftest import Up
from tests.ui.conftest import shot

# One node, one GPU: a second GPU job waits for the first.
CLUSTER = """
pools: [{name: local, price_per_gpu_hour: 2.5}]
nodes: [{name: box, pool: local, capacity: {gpu: 1, cpu: 8, memory: 16Gi}}]
telemetry: {source: fake, file: gpus.json, interval: 0.2s, aggregate: 0.5s, retention: 1h}
tenants: [{name: vision}, {name: nlp}]
queues:
  - {name: train, tenant: vision, quota: {local: {gpu: 1}}}
  - {name: nlp-q, tenant: nlp, quota: {local: {gpu: 0}}}
"""


def job(name: str, *, seconds: float, queue: str = "train", gpus: int = 1) -> str:
    code = f"import time; print('hello from {name}', flush=True); time.sleep({seconds})"
    return json.dumps(
        {
            "name": name,
            "queue": queue,
            "replicas": [{"count": 1, "resources": {"gpu": gpus}}],
            "command": [sys.executable, "-c", code],
        }
    )


@pytest.fixture
def deployment(up: Up) -> tuple[Up, dict[str, str]]:
    (up.root / "cluster.yaml").write_text(CLUSTER)
    (up.root / "gpus.json").write_text(json.dumps({"box/0": {"utilization": 40}}))
    up.start("-f", str(up.root / "cluster.yaml"))
    with up.client() as admin:
        tokens = {
            tenant: admin.create_token(user=f"{tenant}-member", tenant=tenant, role="member")[
                "token"
            ]
            for tenant in ("vision", "nlp")
        }
    return up, tokens


def sign_in(page: Page, up: Up, token: str) -> None:
    page.goto(f"{up.url}/?token={token}")
    expect(page).to_have_url(f"{up.url}/")  # the token left the address bar
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def test_browser_sign_in_overview_waiting_reason_live_updates_and_cancel(
    deployment: tuple[Up, dict[str, str]], page: Page
) -> None:
    up, tokens = deployment
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        blocker = vision.submit(job("blocker", seconds=600))
        waiting = vision.submit(job("follower", seconds=6))
    sign_in(page, up, tokens["vision"])
    expect(page.get_by_test_id("who")).to_contain_text("vision-member")
    expect(page.get_by_role("heading", name="GPUs by pool")).to_be_visible()
    expect(page.get_by_test_id("running-count")).to_have_text("1")
    expect(page.get_by_test_id("waiting-count")).to_have_text("1")
    expect(page.get_by_role("img", name=re.compile("mean GPU utilisation"))).to_be_visible()
    expect(page.get_by_test_id("in-use-local")).to_have_text("1", timeout=15_000)  # 40% busy
    expect(page.get_by_role("heading", name="Recent alerts")).to_be_visible()
    shot(page, "overview")

    # Its queue's page: the line in order, with reasons and estimates; what runs.
    page.get_by_role("link", name="train").first.click()
    expect(page.get_by_role("heading", name=re.compile("Queue train"))).to_be_visible()
    line = page.get_by_test_id("line")
    expect(line).to_contain_text(waiting["id"])
    expect(line.locator("tbody tr").first.locator("td").first).to_have_text("1")
    expect(page.locator("#queue-running-h + table")).to_contain_text(blocker["id"])
    shot(page, "queue")
    page.go_back()

    # Open the waiting job from the overview and read why it waits.
    page.get_by_role("link", name=waiting["id"]).click()
    expect(page).to_have_url(f"{up.url}/ui/jobs/{waiting['id']}")
    expect(page.get_by_test_id("state")).to_have_text("pending")
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        said = vision.why(waiting["id"])["reason"]  # the page says what `allot why` says
    expect(page.get_by_test_id("reason")).to_contain_text(said["code"])
    expect(page.get_by_test_id("reason")).to_contain_text(said["message"])
    shot(page, "job-pending")

    # Free its GPU: the page follows it to running, then succeeded, without a reload.
    page.evaluate("window.stayed = true")
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        vision.cancel(blocker["id"])
    expect(page.get_by_test_id("state")).to_have_text("running", timeout=30_000)
    expect(page.get_by_role("img", name=re.compile("GPU utilisation"))).to_be_visible()
    expect(page.get_by_test_id("cost")).to_contain_text("per GPU-hour")
    expect(page.get_by_test_id("state")).to_have_text("succeeded", timeout=30_000)
    expect(page.get_by_test_id("log")).to_contain_text("hello from follower")
    assert page.evaluate("window.stayed") is True  # the same page: nothing reloaded it
    expect(page.locator("ol.timeline")).to_contain_text("running")
    shot(page, "job-succeeded")

    # Cancel a running job from its page.
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        victim = vision.submit(job("to-cancel", seconds=600))
    page.goto(f"{up.url}/ui/jobs/{victim['id']}")
    expect(page.get_by_test_id("state")).to_have_text("running", timeout=30_000)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel job").click()
    expect(page.get_by_test_id("state")).to_contain_text("cancelled")
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    with AllotmentClient(up.url, up.config["token"]) as admin:  # audited as the API's are
        [record] = admin.audit(action="job.cancel", object=victim["id"])["records"]
    assert record["user"] == "vision-member" and record["result"] == "ok"
    shot(page, "job-cancelled")
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        assert vision.get_job(victim["id"])["state"] == "cancelled"


def test_browser_reports_page_and_its_csv_are_the_same_figures_as_allot_report(
    deployment: tuple[Up, dict[str, str]], page: Page
) -> None:
    up, tokens = deployment
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        done = vision.submit(job("counted", seconds=0.5))
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        for _ in range(100):
            if vision.get_job(done["id"])["state"] == "succeeded":
                break
            page.wait_for_timeout(200)
    sign_in(page, up, tokens["vision"])
    page.get_by_role("link", name="Reports").click()
    expect(page.get_by_role("heading", name="Reports")).to_be_visible()
    expect(page.get_by_test_id("report-title")).to_contain_text("tenant vision")
    expect(page.get_by_role("heading", name="usage and cost by tenant")).to_be_visible()
    page.get_by_label("by").select_option("queue")
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_role("heading", name="usage and cost by queue")).to_be_visible()
    expect(page.locator(".report table").first).to_contain_text("train")
    shot(page, "reports")
    with page.expect_download() as downloading:
        page.get_by_test_id("csv").click()
    csv = Path(downloading.value.path()).read_text()
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        data = vision.report(since="7d", by="queue")
    assert csv.splitlines()[0] == csv_text(data).splitlines()[0]
    assert csv.splitlines()[1].split(",")[:3] == csv_text(data).splitlines()[1].split(",")[:3]
    # A window that cannot be read is said on the page.
    answer = page.goto(f"{up.url}/ui/reports?since=yesterday")
    assert answer is not None and answer.status == 422
    expect(page.get_by_test_id("report-title")).to_contain_text("yesterday")


def test_browser_admin_page_tokens_audit_chain_and_revoke(
    deployment: tuple[Up, dict[str, str]], page: Page
) -> None:
    up, tokens = deployment
    sign_in(page, up, up.config["token"])  # allot up's platform admin
    page.get_by_role("link", name="Admin").click()
    expect(page.get_by_role("heading", name="Admin")).to_be_visible()
    row = page.locator("tr", has_text="nlp-member")
    expect(row.get_by_test_id("token-state")).to_have_text("active")
    expect(page.get_by_test_id("chain")).to_contain_text("hash chain intact")
    expect(page.locator("#audit-h + p + form + table")).to_contain_text("token.create")
    page.get_by_label("action").fill("token.create")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"action=token.create"))
    shot(page, "admin")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator("tr", has_text="nlp-member").get_by_test_id("token-state")).to_contain_text(
        "revoked"
    )
    with AllotmentClient(up.url, tokens["nlp"]) as nlp, pytest.raises(Exception) as refused:
        nlp.list_jobs()
    assert "revoked" in str(refused.value)
    with AllotmentClient(up.url, up.config["token"]) as admin:  # audited as the API's are
        [record] = admin.audit(action="token.change")["records"]
    assert record["user"] != "anonymous" and record["result"] == "ok"
    # A member has no admin page, and no link to one.
    member = page.context.browser.new_page()  # type: ignore[union-attr]
    sign_in(member, up, tokens["vision"])
    expect(member.get_by_role("link", name="Admin")).to_have_count(0)
    answer = member.goto(f"{up.url}/ui/admin")
    assert answer is not None and answer.status == 403
    member.close()


def test_browser_a_member_of_one_tenant_sees_none_of_another_tenants_jobs(
    deployment: tuple[Up, dict[str, str]], page: Page
) -> None:
    up, tokens = deployment
    with AllotmentClient(up.url, tokens["vision"]) as vision:
        theirs = vision.submit(job("vision-secret", seconds=600))
    with AllotmentClient(up.url, tokens["nlp"]) as nlp:
        mine = nlp.submit(job("nlp-own", seconds=600, queue="nlp-q", gpus=0))
    sign_in(page, up, tokens["nlp"])
    content = page.content()
    assert mine["id"] in content
    assert theirs["id"] not in content and "vision-secret" not in content
    assert not re.search(r"\btrain\b", page.locator("#queues-h + table").inner_text())
    shot(page, "overview-other-tenant")
    # A laptop's screen and a wide monitor: nothing runs off the page sideways.
    for path in ("/", f"/ui/jobs/{mine['id']}", "/ui/queues/nlp-q", "/ui/reports"):
        page.goto(up.url + path)
        for width, height in ((1280, 720), (1920, 1080), (900, 700)):
            page.set_viewport_size({"width": width, "height": height})
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, (path, width, overflow)
    shot(page, "reports-narrow")
    answer = page.goto(f"{up.url}/ui/jobs/{theirs['id']}")
    assert answer is not None and answer.status == 404
    assert "vision-secret" not in page.content()
    fragment = page.goto(f"{up.url}/ui/fragments/jobs/{theirs['id']}")
    assert fragment is not None and fragment.status == 404
