"""A real browser for the dashboard's tests: Debian's Chromium (installed here from
Debian's packages when missing), driven headless by Playwright for Python, pointed at
that browser (no browser download). Each test's screenshots are kept under
``artefacts/screenshots/`` at the repository's root."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.server.conftest import up  # noqa: F401  (allot up as a process)

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artefacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"


def ensure_chromium() -> str:
    """The system Chromium, installed from Debian's packages when missing."""
    if shutil.which("chromium") is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"],
            check=True,
            capture_output=True,
            env=env,
        )
    found = shutil.which("chromium")
    assert found is not None, "chromium is not installed and could not be installed"
    return found


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    executable = ensure_chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(30_000)
    yield opened
    context.close()


def shot(page: Page, name: str) -> Path:
    """Keep a screenshot of the page as it is now."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
