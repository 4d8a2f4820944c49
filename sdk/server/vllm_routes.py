"""Routes vLLM's server has that clients and platforms call: ``GET /v1/models/{id}``, ``/tokenizer_info``,
``/ping`` and ``/invocations`` (SageMaker), plus ``--allowed-origins`` (CORS) and ``--root-path``.

``/invocations`` takes a body of any of the generation or embedding routes and answers as that route would:
``messages`` -> chat completions, ``prompt`` -> completions, ``input`` -> embeddings (vLLM's dispatch).
It calls the same endpoint functions, so every check (auth, model name, limits, refusals) is the same.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from octavo.errors import APIError

# body key -> (route path, request model import path)
_INVOCATIONS = (("messages", "/v1/chat/completions", "octavo.server.protocol:ChatCompletionRequest"),
                ("prompt", "/v1/completions", "octavo.server.protocol:CompletionRequest"),
                ("input", "/v1/embeddings", "octavo.server.embeddings:EmbeddingRequest"))


def _endpoint(app: FastAPI, path: str) -> Any:
    for route in app.router.routes:
        if getattr(route, "path", None) == path and "POST" in getattr(route, "methods", ()):
            return route.endpoint
    return None


def register_vllm_routes(app: FastAPI, engine: Any, settings: Any, check_model: Any) -> None:
    """Add the routes above to ``app`` (call after the generation and embedding routes exist)."""
    srv = settings.server
    if srv.root_path:
        app.root_path = srv.root_path  # behind a proxy that serves the app under a path prefix
    if srv.allowed_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(srv.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=False)

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        check_model(model_id)
        info = engine.get_model_info()
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "octavo", "root": info.model,
                "parent": None, "max_model_len": info.max_model_len}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict:
        tok = engine.get_tokenizer()
        if tok is None:
            raise APIError(404, "This server runs without a tokenizer (skip_tokenizer_init).")
        return {"tokenizer_class": type(tok).__name__, "model_max_length": engine.get_model_info().max_model_len,
                "bos_token": tok.bos_token, "eos_token": tok.eos_token, "pad_token": tok.pad_token,
                "unk_token": tok.unk_token, "chat_template": getattr(tok, "chat_template", None),
                "vocab_size": len(tok), "added_tokens_decoder": {
                    str(i): {"content": t.content, "special": t.special}
                    for i, t in getattr(tok, "added_tokens_decoder", {}).items()}}

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        if engine.errored:
            return JSONResponse({"error": {"message": "The engine is down.", "type": "service_unavailable_error",
                                           "param": None, "code": 503}}, status_code=503)
        return Response(status_code=200)

    @app.post("/invocations")
    async def invocations(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            raise APIError(400, "The request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise APIError(400, "The request body must be a JSON object.")
        for key, path, model_path in _INVOCATIONS:
            if key in body:
                endpoint = _endpoint(app, path)
                if endpoint is None:
                    raise APIError(400, f"{path} is not served by this model, so /invocations cannot take '{key}'.",
                                   param=key)
                module, cls = model_path.split(":")
                import importlib

                model_cls = getattr(importlib.import_module(module), cls)
                try:
                    parsed = model_cls.model_validate(body)
                except ValidationError as e:
                    raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
                                                 ) from None
                kwargs = {"body": parsed}
                if "request" in endpoint.__code__.co_varnames[:endpoint.__code__.co_argcount]:
                    kwargs["request"] = request
                return await endpoint(**kwargs)
        raise APIError(400, "/invocations needs 'messages' (chat), 'prompt' (completions) or 'input' (embeddings).")


def with_vllm_names(exposition: bytes) -> bytes:
    """The Prometheus text again under vLLM's ``vllm:`` prefix, appended: octavo's metric names after the prefix
    are vLLM's (``num_requests_running``, ``kv_cache_usage_perc``, ``time_to_first_token_seconds``, ...), so
    existing vLLM Grafana dashboards work unchanged against ``/metrics``."""
    return exposition + exposition.replace(b"octavo:", b"vllm:")
