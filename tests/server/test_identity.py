"""Users and tokens through ``allot up`` and the ``allot`` command, as processes: the
admin token of ``allot up`` is a platform admin named after the local user; it issues
tenant tokens with ``allot token create``, which others use through ``ALLOT_TOKEN``;
the dashboard shows each only its tenant's jobs; a revoked token is refused."""

from __future__ import annotations

import getpass
from pathlib import Path

import httpx

from tests.api.tenancy import CLUSTER, job
from tests.server.conftest import Up
from tests.server.test_acceptance import allot, allot_json


def test_tokens_through_the_cli(up: Up, tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    up.start("-f", str(cluster))

    made = allot(up, "token", "create", "--user", "bob", "--tenant", "vision", "--expires", "30d")
    bob = made.stdout.strip()
    assert bob.startswith("allot_") and "\n" not in bob  # the token alone on stdout
    assert "shown only now" in made.stderr and "member of tenant vision" in made.stderr
    nick = allot_json(up, "token", "create", "--user", "nick", "--tenant", "nlp")

    (tmp_path / "v.json").write_text(job("vision-q", name="v"))
    (tmp_path / "n.json").write_text(job("nlp-q", name="n"))
    try:
        up.env_overrides = {"ALLOT_TOKEN": bob}
        mine = allot(up, "submit", str(tmp_path / "v.json")).stdout.strip()
        refused = allot(up, "submit", str(tmp_path / "n.json"), check=False)
        assert refused.returncode == 1 and "no queue named 'nlp-q'" in refused.stderr
        assert [j["id"] for j in allot_json(up, "ls")["jobs"]] == [mine]
        denied = allot(up, "token", "ls", check=False)
        assert denied.returncode == 1 and "role admin" in denied.stderr
    finally:
        up.env_overrides = {}

    with up.client() as admin:
        theirs = admin.submit(job("nlp-q", name="n"))
        assert admin.get_job(mine)["user"] == "bob"
        assert theirs["user"] == (getpass.getuser() or "admin")  # allot up's admin

    # The dashboard shows a tenant's principal only its tenant's jobs.
    with httpx.Client(base_url=up.url, follow_redirects=True) as browser:
        page = browser.get(f"/?token={bob}").text
    assert mine in page and theirs["id"] not in page and "nlp-q" not in page

    tokens = allot_json(up, "token", "ls")
    assert {(t["user"], t["tenant"]) for t in tokens} == {("bob", "vision"), ("nick", "nlp")}
    bob_id = next(t["id"] for t in tokens if t["user"] == "bob")
    assert allot(up, "token", "revoke", bob_id).stdout.strip() == f"{bob_id}: revoked"
    answer = httpx.get(f"{up.url}/api/v1/jobs", headers={"Authorization": f"Bearer {bob}"})
    assert answer.status_code == 401 and answer.json()["fields"]["why"] == "revoked"
    still = httpx.get(f"{up.url}/api/v1/jobs", headers={"Authorization": f"Bearer {nick['token']}"})
    assert still.status_code == 200
