"""Hardening through the API: rate limits per token, capped pages, capped bodies, and
YAML that the safe loader refuses (arbitrary tags, alias bombs, deep nesting)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from allotment.api.app import create_app
from allotment.api.auth import AdminDigest, token_digest
from allotment.api.ratelimit import RateLimit, TokenBuckets
from allotment.domain.loading import load_cluster
from allotment.store import migrate
from allotment.store.db import make_engine, session_factory
from tests.api.conftest import EXAMPLES, FakeClock, serve


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_refills_at_its_rate() -> None:
    ticks = Ticks()
    buckets = TokenBuckets(RateLimit(per_second=2, burst=3), ticks)
    assert [buckets.take("a") for _ in range(3)] == [0, 0, 0]
    assert buckets.take("a") == pytest.approx(0.5)
    assert buckets.take("b") == 0  # another token has its own bucket
    ticks.now += 0.5
    assert buckets.take("a") == 0
    ticks.now += 100
    assert [buckets.take("a") for _ in range(3)] == [0, 0, 0]  # never above burst


def test_bucket_memory_is_bounded() -> None:
    buckets = TokenBuckets(RateLimit(burst=1, max_keys=2), Ticks())
    for key in "abc":
        buckets.take(key)
    assert buckets.take("a") == 0  # forgotten, so full again
    assert buckets.take("c") > 0


def test_rate_limit_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        RateLimit(per_second=0)
    with pytest.raises(ValueError):
        RateLimit(burst=0)


def _app(tmp_path: Path, **kwargs: object) -> object:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    migrate.upgrade(engine)
    return create_app(
        cluster=load_cluster(EXAMPLES / "cluster-local.yaml"),
        store_sessions=session_factory(engine),
        clock=FakeClock(),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[str]:
    app = _app(tmp_path, rate_limit=RateLimit(per_second=0.01, burst=3))
    with serve(app) as url:  # type: ignore[arg-type]
        yield url


def test_over_the_limit_is_429_with_retry_after(limited: str) -> None:
    ada = httpx.Client(base_url=limited, headers={"Authorization": "Bearer ada"})
    bob = httpx.Client(base_url=limited, headers={"Authorization": "Bearer bob"})
    with ada, bob:
        assert [ada.get("/api/v1/queues").status_code for _ in range(3)] == [200] * 3
        refused = ada.get("/api/v1/queues")
        assert refused.status_code == 429
        body = refused.json()
        assert body["code"] == "rate_limited" and "retry" in body["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert bob.get("/api/v1/queues").status_code == 200  # per token
        assert ada.get("/api/v1/healthz").status_code == 200  # exempt


ADMIN = "the-admin-token"


def _admin_limited(tmp_path: Path) -> object:
    """An app with real authentication (one admin token) and a tight rate limit."""
    return _app(
        tmp_path,
        rate_limit=RateLimit(per_second=0.01, burst=3),
        authenticator=AdminDigest(token_digest(ADMIN), user="root"),
    )


def test_fault_made_up_tokens_share_their_address_bucket(tmp_path: Path) -> None:
    # With real authentication, a token answered 401 never gets a bucket of its own:
    # rotating made-up tokens is limited by the client's address.
    app = _admin_limited(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as http:  # type: ignore[arg-type]
        codes = [
            http.get("/api/v1/queues", headers={"Authorization": f"Bearer bogus-{i}"}).status_code
            for i in range(5)
        ]
        assert codes[:3] == [401] * 3 and codes[3:] == [429, 429]
        # A valid token, once known, spends only its own bucket.
        good = {"Authorization": f"Bearer {ADMIN}"}
        assert http.get("/api/v1/queues", headers=good).status_code == 429  # not known yet


def test_fault_a_known_token_is_not_held_back_by_others_at_its_address(tmp_path: Path) -> None:
    app = _admin_limited(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as http:  # type: ignore[arg-type]
        good = {"Authorization": f"Bearer {ADMIN}"}
        assert http.get("/api/v1/queues", headers=good).status_code == 200
        for i in range(3):
            http.get("/api/v1/queues", headers={"Authorization": f"Bearer bogus-{i}"})
        assert [http.get("/api/v1/queues", headers=good).status_code for _ in range(2)] == [
            200,
            200,
        ]


def test_rate_limit_is_off_by_default(tmp_path: Path) -> None:
    with serve(_app(tmp_path)) as url, httpx.Client(base_url=url) as http:  # type: ignore[arg-type]
        assert {http.get("/api/v1/pools").status_code for _ in range(30)} == {200}


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    with serve(_app(tmp_path)) as url, httpx.Client(base_url=url + "/api/v1") as client:  # type: ignore[arg-type]
        yield client


@pytest.mark.parametrize("path", ["/jobs", "/audit"])
def test_every_list_caps_its_page(http: httpx.Client, path: str) -> None:
    assert http.get(path, params={"limit": 500}).status_code == 200
    too_many = http.get(path, params={"limit": 501})
    assert too_many.status_code == 422 and too_many.json()["code"] == "invalid_request"
    assert http.get(path, params={"limit": 0}).status_code == 422


def test_a_body_over_the_cap_is_413(http: httpx.Client) -> None:
    response = http.post("/jobs", content=b"x" * (1024 * 1024 + 1))
    assert response.status_code == 413 and response.json()["code"] == "body_too_large"


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)

HOSTILE = {
    "python object tag": (
        "!!python/object/apply:os.system ['echo pwned']\n",
        "tag",
    ),
    "python object in a field": (
        "name: !!python/object:builtins.object {}\nqueue: default\n",
        "tag",
    ),
    "alias bomb": (BOMB, "aliases"),
    "too deep": ("name: " + "[" * 100 + "]" * 100 + "\n", "deeper"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_yaml_is_refused_with_a_clear_4xx(http: httpx.Client, case: str) -> None:
    text, word = HOSTILE[case]
    response = http.post("/jobs", json={"spec": text})
    assert 400 <= response.status_code < 500
    body = response.json()
    assert body["code"] == "invalid_config"
    assert word in body["message"]
    assert http.get("/jobs").json()["jobs"] == []


def test_wrong_method_is_405_with_every_allowed_method(http: httpx.Client) -> None:
    response = http.delete("/jobs")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"
    body = response.json()
    assert body["code"] == "method_not_allowed" and body["fields"]["allowed"] == ["GET", "POST"]


def test_unknown_path_is_404_in_the_usual_shape(http: httpx.Client) -> None:
    body = http.get("/no/such/thing").json()
    assert body["code"] == "not_found" and "/api/v1/no/such/thing" in body["message"]


@pytest.mark.parametrize("url", ["/jobs/a%00b", "/jobs?queue=%00", "/audit?user=x%00"])
def test_nul_in_path_or_query_is_400(http: httpx.Client, url: str) -> None:
    response = http.get(url)
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"


def test_nul_in_a_job_file_is_refused(http: httpx.Client) -> None:
    spec = '{"name": "a\\u0000b", "queue": "default", "replicas": []}'
    body = http.post("/jobs", json={"spec": spec}).json()
    assert body["code"] == "invalid_config" and "NUL" in body["message"]


def test_huge_attempt_and_offset_are_422_not_500(http: httpx.Client) -> None:
    job = http.post(
        "/jobs",
        json={"spec": "name: t\nqueue: default\nreplicas: [{name: w, count: 1}]\ncommand: [x]\n"},
    ).json()["id"]
    for params in ({"attempt": 2**70}, {"offset": 2**70}):
        response = http.get(f"/jobs/{job}/logs", params=params)
        assert response.status_code == 422, params
