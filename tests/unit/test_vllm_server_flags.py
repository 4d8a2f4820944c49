"""The log flags of sdk/server/vllm_server.py on its real middleware and throughput logger (the enabled paths
run against a real server in tests/e2e/test_vllm_server.py): each ``disable_*`` flag removes its lines."""

from __future__ import annotations

import asyncio
import logging
import time

from octavo.config import OctavoSettings
from octavo.server.vllm_server import RequestLogMiddleware, ThroughputLog, log_requests_enabled


async def _app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _call(settings, caplog) -> list[str]:
    mw = RequestLogMiddleware(_app, settings)
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "client": ("1.2.3.4", 5),
             "http_version": "1.1", "query_string": b""}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b'{"prompt": "hello"}', "more_body": False}

    async def send(msg):
        sent.append(msg)

    caplog.clear()
    with caplog.at_level(logging.INFO):
        asyncio.run(mw(scope, receive, send))
    return [r.getMessage() for r in caplog.records]


def test_access_and_request_log_flags(caplog):
    on = OctavoSettings.from_kwargs(enable_log_requests=True)
    lines = _call(on, caplog)
    assert any('"POST /v1/completions HTTP/1.1" 200' in x for x in lines)
    assert any("Received request" in x and "hello" in x for x in lines)
    off = OctavoSettings.from_kwargs(enable_log_requests=True, disable_log_requests=True,
                                     disable_uvicorn_access_log=True)
    assert not log_requests_enabled(off) and _call(off, caplog) == []


class _Engine:  # what ThroughputLog needs from an engine: the stats observer list (the server's AsyncLLM has it)
    def __init__(self):
        self.stats_observers = []


class _Stats:
    num_prompt_tokens, num_generation_tokens, num_running_reqs, num_waiting_reqs = 100, 50, 1, 0
    kv_cache_usage, prefix_cache_hit_rate = 0.25, 0.0


def test_throughput_line(caplog, monkeypatch):
    from octavo.server import vllm_server

    engine = _Engine()
    with caplog.at_level(logging.INFO):
        log = ThroughputLog(engine, 0.05)
        engine.stats_observers[0](_Stats())
        time.sleep(0.3)
    assert any("Avg prompt throughput" in r.getMessage() for r in caplog.records)
    log.stop()  # the app's shutdown hook: the thread ends instead of logging forever
    log.thread.join(timeout=2)
    assert not log.thread.is_alive()
    added = []
    monkeypatch.setattr(vllm_server, "ThroughputLog", lambda *a: added.append(a))
    from fastapi import FastAPI

    vllm_server.register_vllm_server(FastAPI(), _Engine(), OctavoSettings.from_kwargs(disable_log_stats=True),
                                     None, None, None)
    assert added == []  # --disable-log-stats: no throughput logger
    monkeypatch.undo()
    import threading

    app, before = FastAPI(), set(threading.enumerate())
    vllm_server.register_vllm_server(app, _Engine(), OctavoSettings.from_kwargs(), None, None, None)
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "octavo-throughput-log"]
    (stop,) = app.router.on_shutdown  # the logger's thread ends with the app
    stop()
    thread.join(timeout=2)
    assert not thread.is_alive()


def test_max_model_len_human_sizes():
    """vLLM's --max-model-len 32k / 32K (powers of 1000 / 1024), from flags and from kwargs."""
    import pytest

    from octavo.cli.flags import settings_from_args
    from octavo.cli.main import build_parser

    assert settings_from_args(build_parser().parse_args(["serve", "--max-model-len", "32k"])).model.max_model_len \
        == 32000
    assert OctavoSettings.from_kwargs(max_model_len="32K").model.max_model_len == 32768
    with pytest.raises(ValueError, match="max_model_len"):
        OctavoSettings.from_kwargs(max_model_len="lots")
