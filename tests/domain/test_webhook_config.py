"""A tenant's ``webhook`` in ``cluster.yaml``: http(s) URLs only, an optional secret,
and the usual errors naming the key and the line."""

from __future__ import annotations

import pytest

from allotment.domain.errors import ConfigError
from allotment.domain.loading import load_cluster_text

CLUSTER = """
tenants:
  - name: vision
    webhook: {hook}
"""


@pytest.mark.parametrize(
    "url", ["https://hooks.example/allotment", "http://127.0.0.1:8080/hook?team=vision"]
)
def test_http_and_https_urls_are_accepted(url: str) -> None:
    cluster = load_cluster_text(CLUSTER.format(hook=f'{{url: "{url}", secret: s}}'))
    webhook = cluster.tenants["vision"].webhook
    assert webhook is not None and (webhook.url, webhook.secret) == (url, "s")


def test_no_webhook_by_default() -> None:
    assert load_cluster_text("tenants: [{name: vision}]").tenants["vision"].webhook is None


@pytest.mark.parametrize(
    "url", ["ftp://hooks.example/x", "mailto:ops@hooks.example", "hooks.example", "https://"]
)
def test_other_urls_are_refused_naming_the_line(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_cluster_text(CLUSTER.format(hook=f'{{url: "{url}"}}'))
    [issue] = info.value.issues
    assert "must be an http:// or https:// URL" in issue.message
    assert issue.line == 4


def test_an_unknown_key_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_cluster_text(CLUSTER.format(hook='{url: "https://h.example/", secrets: x}'))
    assert "secrets" in str(info.value)
