"""With the UI on and an API key: the page shells and static files load without the key (they hold no
data), every route they read from still needs it, and the files come with the right types."""

from __future__ import annotations

import httpx
import pytest

from tests.browser.helpers import auth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_shells_are_public_and_data_is_not(server):
    for path in ("/", "/ui/", "/dashboard"):
        r = httpx.get(server.url + path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), path
        assert "<script" in r.text and "cdn" not in r.text.lower() and "https://" not in r.text, path
        assert "script-src" not in r.headers["content-security-policy"]  # default-src 'self': no inline script
        assert "default-src 'self'" in r.headers["content-security-policy"], path
    assert httpx.get(server.url + "/ui").headers["location"] == "/ui/"
    for name, kind in (("chat.js", "javascript"), ("ui.css", "text/css"), ("markdown.js", "javascript")):
        r = httpx.get(server.url + "/ui/static/" + name)
        assert r.status_code == 200 and kind in r.headers["content-type"], name
    assert httpx.get(server.url + "/ui/static/nothing.js", headers=auth()).status_code == 404
    for path in ("/v1/models", "/metrics", "/v1/octavo/info"):
        assert httpx.get(server.url + path).status_code == 401, path
        assert httpx.get(server.url + path, headers=auth()).status_code == 200, path
