"""Fixtures of the browser tests: one real ``octavo serve`` (embedded SmolLM2, with an API key) and one
headless Chromium driven by Playwright, shared by every test in this folder (package scope: both are
gone before the rest of the suite runs).

The tests skip, with the reason, when the Python package ``playwright`` or a Chromium binary is missing
(``apt-get install chromium``; ``playwright install`` cannot download browsers on our machines, so we drive
the system's). ``OCTAVO_CHROMIUM`` names another binary. Screenshots go to ``OCTAVO_BROWSER_ARTIFACTS``,
default ``tests/browser/artifacts/`` (gitignored). With ``OCTAVO_REQUIRE_BROWSER=1`` (``.ci/run`` sets it) a
missing browser fails the tests instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser.helpers import ARTIFACTS, SERVER_ARGS, chromium_path, skip_reason


def pytest_collection_modifyitems(config, items):
    reason = skip_reason()
    if reason and os.environ.get("OCTAVO_REQUIRE_BROWSER") != "1":  # CI sets it: there they must run
        for item in items:
            if Path(str(item.fspath)).parent == Path(__file__).parent:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="package")
def server():
    from octavo.server.launch import ServerProcess

    srv = ServerProcess(SERVER_ARGS).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="package")
def browser():
    reason = skip_reason()
    if reason:
        pytest.fail(f"OCTAVO_REQUIRE_BROWSER=1 but {reason}")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    b = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                          args=["--disable-gpu", "--disable-dev-shm-usage"])  # containers: small /dev/shm
    yield b
    b.close()
    pw.stop()


@pytest.fixture(scope="package")
def context(browser, server):
    """One desktop-sized browsing context: the API key typed once stays in its localStorage."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=server.url)
    yield ctx
    ctx.close()


@pytest.fixture(scope="package")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
