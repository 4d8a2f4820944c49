"""The dashboard in headless Chromium against a real ``octavo serve``: the startup summary matches the
server's, and the live numbers move while a request runs (running 1 then 0, generated tokens/s above 0,
the finished count and the latency percentiles appear once it is done).
"""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.browser.helpers import auth, open_page, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _text(page, selector: str) -> str:
    return page.text_content(selector) or ""


def test_dashboard_moves_while_a_request_runs(context, server, artifacts):
    page, errors = open_page(context, "/dashboard", "#info-model")
    info = httpx.get(server.url + "/v1/octavo/info", headers=auth()).json()
    assert _text(page, "#info-model") == info["model"] == "SmolLM2-135M-Instruct"
    assert _text(page, "#info-num_kv_blocks") == str(info["num_kv_blocks"]) and info["num_kv_blocks"] > 0
    assert _text(page, "#info-dtype") == "float32" and _text(page, "#info-platform") == "cpu"
    assert "gguf" in _text(page, "#info-quantization").lower()
    wait_for(lambda: _text(page, "#running") == "0", 10, "the dashboard's first poll")
    finished_before = int(_text(page, "#finished"))

    # a long streamed request, watched on the page, then dropped (the server aborts it)
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 500, "ignore_eos": True,
            "temperature": 0, "stream": True}
    stop, chunks = threading.Event(), []

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=auth(), timeout=120) as r:
            for line in r.iter_lines():
                chunks.append(line)
                if stop.is_set():
                    return

    worker = threading.Thread(target=stream, daemon=True)
    worker.start()
    try:
        wait_for(lambda: _text(page, "#running") == "1", 30, "the dashboard to show 1 running request")
        wait_for(lambda: float(_text(page, "#tps-out").replace("–", "0") or 0) > 0, 15,
                 "generated tokens/s above 0 while the request runs")
        kv = _text(page, "#kv-usage")
        assert kv.endswith("%") and float(kv.split()[0]) > 0, kv
        page.wait_for_timeout(2500)  # a few more points on the charts for the screenshot
        page.screenshot(path=str(artifacts / "dashboard.png"), full_page=True)
    finally:
        stop.set()
        worker.join(60)
    assert len(chunks) > 3
    wait_for(lambda: _text(page, "#running") == "0", 10, "the running count to go back to 0")
    # a short request that finishes: the finished count and the latency percentiles move
    done = httpx.post(server.url + "/v1/chat/completions", headers=auth(), timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "ignore_eos": True}).json()
    assert done["usage"]["completion_tokens"] == 8
    wait_for(lambda: int(_text(page, "#finished")) == finished_before + 1, 10, "the finished count to move")
    wait_for(lambda: _text(page, "#ttft").endswith(("ms", "s")), 10, "a TTFT percentile")
    assert _text(page, "#itl").endswith(("ms", "s")) and "req" in _text(page, "#itl-sub")
    assert page.locator("#tile-tps-out svg path.line").get_attribute("d").count("L") >= 3, "no chart drawn"
    assert not errors, errors
    page.close()
