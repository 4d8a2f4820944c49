"""vLLM's server behaviours beyond the routes' bodies: request-id headers, request / access / throughput logs,
several served model names, TLS options, and the dev-mode routes (sleep mode, collective_rpc).

    --enable-request-id-headers   every response carries X-Request-Id (the client's, else a new one); without
                                  it only the generation routes do (they always did)
    --enable-log-requests         one line per generation request: its id, route and body (``--max-log-len``
                                  characters); --disable-log-requests (vLLM's older flag) keeps them off
    access log                    one line per request: client, method, path, status, milliseconds
                                  (``--disable-uvicorn-access-log`` turns it off)
    throughput log                every ``OCTAVO_LOG_STATS_INTERVAL`` s (default 10) while there is work:
                                  prompt and generation tokens/s, running, waiting, KV usage, prefix hits
                                  (``--disable-log-stats`` turns it off)
    dev mode                      ``OCTAVO_SERVER_DEV_MODE=1`` (or vLLM's ``VLLM_SERVER_DEV_MODE=1``): POST /sleep
                                  ?level=, POST /wake_up ?tags=, GET /is_sleeping, POST /collective_rpc,
                                  POST /reset_prefix_cache. Off: those paths are 404, as in vLLM.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Query, Request

from octavo.env_flags import env_float, env_switch
from octavo.errors import APIError

logger = logging.getLogger("octavo.server")
access_logger = logging.getLogger("octavo.access")
_LOGGED_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/invocations",
                  "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank")


def dev_mode() -> bool:
    """``OCTAVO_SERVER_DEV_MODE`` or vLLM's ``VLLM_SERVER_DEV_MODE`` is 1; each 1/0 only (both are checked)."""
    return any([env_switch("OCTAVO_SERVER_DEV_MODE", default=False), env_switch("VLLM_SERVER_DEV_MODE", default=False)])


def log_stats_interval() -> float:
    """Seconds between throughput lines: ``OCTAVO_LOG_STATS_INTERVAL``, default 10, at least 0.1."""
    return env_float("OCTAVO_LOG_STATS_INTERVAL", 10.0, minimum=0.1)


def check_server_settings(settings: Any) -> None:
    """TLS options that cannot work together fail at start, naming the flag."""
    srv = settings.server
    if bool(srv.ssl_keyfile) != bool(srv.ssl_certfile):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together: give both (TLS) or neither.")
    for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = getattr(srv, name)
        if path and not os.path.isfile(path):
            raise ValueError(f"--{name.replace('_', '-')}: no such file {path!r}.")
    if srv.ssl_cert_reqs and not srv.ssl_ca_certs:
        raise ValueError("--ssl-cert-reqs needs --ssl-ca-certs (the CAs client certificates are checked against).")


def uvicorn_ssl_kwargs(settings: Any) -> dict[str, Any]:
    srv = settings.server
    if not srv.ssl_certfile:
        return {}
    return {"ssl_keyfile": srv.ssl_keyfile, "ssl_certfile": srv.ssl_certfile, "ssl_ca_certs": srv.ssl_ca_certs,
            "ssl_cert_reqs": srv.ssl_cert_reqs}


def log_requests_enabled(settings: Any) -> bool:
    return bool(settings.server.enable_log_requests) and not settings.server.disable_log_requests


class RequestLogMiddleware:
    """Pure ASGI: sees each request's body as the app reads it (no second read); for generation routes with
    ``--enable-log-requests`` logs the request itself as its response starts (so a stream's request is logged when
    the stream begins, not when it ends; the app has read the whole body by then), and an access line when the
    response ends; adds X-Request-Id to every response with ``--enable-request-id-headers``."""

    def __init__(self, app: Any, settings: Any) -> None:
        self.app = app
        srv = settings.server
        self.access = not srv.disable_uvicorn_access_log
        self.requests = log_requests_enabled(settings)
        self.max_len = srv.max_log_len
        self.id_headers = srv.enable_request_id_headers

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = [0]
        rid = [None]
        logged = [False]
        body = bytearray()
        path = scope.get("path", "")
        want_body = self.requests and scope.get("method") == "POST" and path in _LOGGED_ROUTES

        async def recv() -> dict:
            msg = await receive()
            if want_body and msg.get("type") == "http.request" and len(body) < 1 << 20:
                body.extend(msg.get("body", b""))
            return msg

        async def snd(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                headers = list(msg.get("headers", []))
                found = next((v for k, v in headers if k.lower() == b"x-request-id"), None)
                if found is None and self.id_headers:
                    given = next((v for k, v in scope.get("headers", []) if k == b"x-request-id"), None)
                    found = given or uuid.uuid4().hex.encode()
                    headers.append((b"x-request-id", found))
                    msg = {**msg, "headers": headers}
                rid[0] = found.decode(errors="replace") if found else None
                if want_body and not logged[0]:
                    logged[0] = True
                    self._log_request(rid[0], path, bytes(body))
            await send(msg)

        try:
            await self.app(scope, recv, snd)
        finally:
            if want_body and not logged[0]:  # (the app failed before its response started)
                self._log_request(rid[0], path, bytes(body))
            if self.access:
                client = scope.get("client") or ("-", 0)
                query = scope.get("query_string", b"").decode(errors="replace")
                access_logger.info('%s:%s "%s %s%s HTTP/%s" %d %.1fms', client[0], client[1], scope.get("method"),
                                   path, f"?{query}" if query else "", scope.get("http_version", "1.1"), status[0],
                                   (time.perf_counter() - start) * 1000)

    def _log_request(self, rid: str | None, path: str, body: bytes) -> None:
        text = body.decode(errors="replace")
        try:
            text = json.dumps(json.loads(text), ensure_ascii=False)
        except ValueError:
            pass
        if self.max_len is not None and len(text) > self.max_len:
            text = text[:self.max_len] + "..."
        logger.info("Received request %s: %s %s", rid, path, text)


class ThroughputLog:
    """vLLM's periodic line: tokens/s since the last line, running/waiting requests, KV usage, prefix hits."""

    def __init__(self, engine: Any, interval_s: float) -> None:
        self.interval_s = interval_s
        self.stats = None
        self._last = (0, 0, time.monotonic())
        self._stopped = threading.Event()
        engine.stats_observers.append(self._observe)
        self.thread = threading.Thread(target=self._run, name="octavo-throughput-log", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Ends the logging thread (the app's shutdown calls it: a server stopped in-process leaves no thread)."""
        self._stopped.set()

    def _observe(self, stats: Any) -> None:
        self.stats = stats

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            s = self.stats
            if s is None:
                continue
            prompt, gen, t0 = self._last
            now = time.monotonic()
            dp, dg = s.num_prompt_tokens - prompt, s.num_generation_tokens - gen
            self._last = (s.num_prompt_tokens, s.num_generation_tokens, now)
            if dp <= 0 and dg <= 0 and not s.num_running_reqs and not s.num_waiting_reqs:
                continue  # idle: no line (as vLLM)
            dt = max(now - t0, 1e-6)
            logger.info("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                        "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                        dp / dt, dg / dt, s.num_running_reqs, s.num_waiting_reqs, 100 * s.kv_cache_usage,
                        100 * s.prefix_cache_hit_rate)


def _utility_error(e: Exception) -> APIError:
    return APIError(400, str(e).removeprefix("ValueError: "))


def register_dev_routes(app: FastAPI, engine: Any) -> None:
    """Sleep mode, collective_rpc and reset_prefix_cache over HTTP, only in dev mode (vLLM's rule)."""

    @app.post("/sleep")
    async def sleep(level: int = Query(1)) -> dict:
        try:
            return {"freed": await engine.sleep(level)}
        except RuntimeError as e:
            raise _utility_error(e) from None

    @app.post("/wake_up")
    async def wake_up(tags: list[str] | None = Query(None)) -> dict:
        try:
            await engine.wake_up(tags)
        except RuntimeError as e:
            raise _utility_error(e) from None
        return {}

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict:
        return {"is_sleeping": await engine.is_sleeping()}

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise APIError(400, "The request body is not valid JSON.") from None
        method = body.get("method") if isinstance(body, dict) else None
        if not isinstance(method, str):
            raise APIError(400, "collective_rpc needs 'method': a worker method name or 'module:function'.",
                           param="method")
        try:
            results = await engine.collective_rpc(method, timeout=body.get("timeout"), args=body.get("args") or (),
                                                  kwargs=body.get("kwargs") or {})
        except (RuntimeError, TypeError) as e:
            raise _utility_error(e) from None
        return {"results": results}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        return {"reset": await engine.reset_prefix_cache()}


def register_vllm_server(app: FastAPI, engine: Any, settings: Any, serving: Any, check_model: Any,
                         check_ready: Any) -> None:
    """Everything in this module plus ``/v1/responses``; called once by ``build_app``."""
    from octavo.server.responses import register_responses_routes

    register_responses_routes(app, serving, check_model, check_ready)
    if dev_mode():
        register_dev_routes(app, engine)
        logger.warning("dev mode (OCTAVO_SERVER_DEV_MODE=1): /sleep, /wake_up, /is_sleeping, /collective_rpc and "
                       "/reset_prefix_cache are served; do not expose this server.")
    if not settings.server.disable_log_stats:
        app.router.on_shutdown.append(ThroughputLog(engine, log_stats_interval()).stop)
    app.add_middleware(RequestLogMiddleware, settings=settings)
