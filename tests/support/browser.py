"""A real headless browser for the web view's tests: Chromium from the system's packages, driven
by Playwright (the fixture skips, naming what is missing)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.paths import REPO

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DATA = REPO / "tests" / "support" / "data"


def artefacts() -> Path:
    d = Path(os.environ.get("HPNLAB_TEST_ARTEFACTS") or REPO / "results" / "test-artefacts")
    (d / "web").mkdir(parents=True, exist_ok=True)
    return d / "web"


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Chromium is missing ({CHROMIUM}: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright for Python is missing (pip install playwright)")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-profile")),
                                                   executable_path=CHROMIUM, args=ARGS, headless=True,
                                                   viewport={"width": 1500, "height": 620})
        try:
            yield ctx
        finally:
            ctx.close()


def open_page(browser, url: str):
    page = browser.new_page()
    page.goto(url)
    page.wait_for_selector('body[data-ready="1"]', timeout=15000)
    return page
