"""Helpers of the browser tests: the Chromium to drive, why the tests skip, /metrics reads, polling."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import httpx

KEY = "ui-test-key"
ARTIFACTS = Path(os.environ.get("OCTAVO_BROWSER_ARTIFACTS", Path(__file__).parent / "artifacts"))
SERVER_ARGS = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20), "--api-key", KEY,
               "--uvicorn-log-level", "warning"]


def chromium_path() -> str | None:
    """The Chromium binary to drive, or None."""
    named = os.environ.get("OCTAVO_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def skip_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package 'playwright' is not installed (pip install -e '.[dev]')"
    if chromium_path() is None:
        return "no Chromium binary (apt-get install chromium, or set OCTAVO_CHROMIUM)"
    return None


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def metric(server, name: str) -> float:
    """One unlabelled-sum value from the server's /metrics (read with the key, outside the browser)."""
    text = httpx.get(server.url + "/metrics", headers=auth(), timeout=10).text
    values = [float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(values)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def open_page(context, path: str, ready: str):
    """Open ``path``, type the API key if the page asks for it, wait for ``ready``; returns (page, js errors)."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path)
    first = page.wait_for_selector(f"#key-dialog[open], {ready}", state="attached", timeout=15_000)
    if first.get_attribute("id") == "key-dialog":
        page.fill("#key-input", KEY)
        page.press("#key-input", "Enter")
        page.wait_for_selector(ready, state="attached", timeout=15_000)
    return page, errors
