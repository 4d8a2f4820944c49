"""The OpenAI-compatible FastAPI app: ``build_app(engine, settings)``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``POST /tokenize``,
``POST /detokenize``, ``GET /health``, ``GET /version``, ``GET /metrics``, plus whatever plugins add
through ``octavo_add_routes``. Every error is OpenAI-shaped, ``{"error": {"message", "type", "param",
"code"}}``: 400 invalid parameters or malformed JSON (FastAPI's 422 is turned into 400), 401 missing or
wrong API key, 404 unknown model or route, 503 overloaded (with ``Retry-After``) or engine dead. Bad
input never produces a 500.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from octavo.errors import APIError
from octavo.server.disconnect import until_disconnect
from octavo.server.errors import classify, error_response
from octavo.server.guard import Guard, ServerState
from octavo.server.metrics import ServerMetrics
from octavo.server.offload import run_bounded
from octavo.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from octavo.server.serving import RENDER_TIMEOUT_S, OpenAIServing, new_request_id
from octavo.server.ui import is_public_ui_path, register_ui_routes
from octavo.version import __version__

logger = logging.getLogger("octavo.server")

def _model_names(engine: Any, settings: Any) -> list[str]:
    """Names a request may use for the model; the first is what responses and /v1/models report."""
    info = engine.get_model_info()
    names = list(settings.model.served_model_name or [info.served_model_name])  # --served-model-name a b
    if settings.model.served_model_name is None:
        # A local path is an awkward name: report its file or directory stem (as llama.cpp does).
        path = Path(info.served_model_name)
        if path.exists():
            stem = path.name.removesuffix(".gguf").split(".Q")[0].split(".q")[0] or path.name
            names.insert(0, stem)
        if info.model not in names:
            names.append(info.model)
    return names


def build_app(engine: Any, settings: Any) -> FastAPI:
    """Build the server's FastAPI app around a started ``AsyncLLM``.

    Args:
        engine: the ``AsyncLLM`` that serves requests.
        settings: the ``OctavoSettings`` (``server`` section: api_key, max_queue_len).

    Returns:
        The app; run it with uvicorn (``octavo serve`` does).
    """
    app = FastAPI(title="octavo", version=__version__, docs_url=None, redoc_url=None)
    names = _model_names(engine, settings)
    model_name = names[0]
    serving = OpenAIServing(engine, model_name)
    from octavo.lora.serving import served_loras

    serving.loras = served_loras(settings)  # --lora-modules: each adapter's name is a model id too
    metrics = ServerMetrics(model_name)
    metrics.attach(engine)
    app.state.engine, app.state.settings, app.state.metrics, app.state.model_name = engine, settings, metrics, \
        model_name
    api_key = settings.server.api_key
    max_queue_len = settings.server.max_queue_len

    # ------------------------------------------------------------------------------------ errors
    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e.status, e.message, param=e.param, code=e.code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return error_response(400, "The request body is not valid JSON.")
        param = _param_path(first.get("loc", ()))
        msg = "; ".join(f"{_param_path(er.get('loc', ())) or 'body'}: "
                        f"{str(er.get('msg', 'invalid')).removeprefix('Value error, ')}" for er in errs[:3])
        return error_response(400, f"Invalid request: {msg}", param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        msg = "Not found: no such route." if e.status_code == 404 else str(e.detail)
        return error_response(e.status_code, msg, headers=getattr(e, "headers", None))

    @app.exception_handler(ValueError)
    async def _value_error(_: Request, e: ValueError) -> JSONResponse:
        status, message, param = classify(e)
        return error_response(status, message, param=param)

    from octavo.errors import EngineDeadError

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(_: Request, e: EngineDeadError) -> JSONResponse:
        status, message, param = classify(e)
        return error_response(status, message, param=param)
    # Anything else is caught by the Guard (outermost): one traceback, a JSON 500, the connection kept.

    # ------------------------------------------------------------------------------------ auth
    if api_key:
        expected = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def _auth(request: Request, call_next: Any) -> Response:
            if request.url.path != "/health" and request.method != "OPTIONS" and \
                    not is_public_ui_path(request.url.path, settings):  # page shells: no data, they ask for the key
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):  # constant time: no key-guessing by timing
                    return error_response(401, "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                                          code="invalid_api_key")
            return await call_next(request)

    # ------------------------------------------------------------------------------------ helpers
    def check_model(model: str | None) -> None:
        if model is not None and model not in names and model not in serving.loras:  # loras: run-time too
            raise APIError(404, f"The model {model!r} does not exist; this server serves {model_name!r} "
                           "(see GET /v1/models).", param="model", code="model_not_found")

    def check_ready() -> None:
        from octavo.errors import EngineDeadError

        if engine.errored:
            raise EngineDeadError(engine.dead_reason or "the engine core died")
        if max_queue_len is not None and engine.num_waiting >= max_queue_len:
            raise APIError(503, f"The server is overloaded: {engine.num_waiting} requests are already waiting "
                           f"(--max-queue-len {max_queue_len}); retry later.", headers={"Retry-After": "1"})

    def client_request_id(body: Any, request: Request, prefix: str) -> str:
        """The client's id for this request (body ``request_id``, else the ``X-Request-Id`` header, else a new
        one): echoed in the response and its ``X-Request-Id``; the engine runs it under a unique internal id."""
        rid = body.request_id or request.headers.get("x-request-id") or new_request_id(prefix)
        if len(rid) > 256 or not rid.isprintable():
            raise APIError(400, "request_id must be at most 256 printable characters.", param="request_id")
        return rid

    async def respond(request: Request, result: Any, rid: str) -> Response:
        if isinstance(result, Response):  # the client went away (499)
            return result
        if isinstance(result, dict):
            return JSONResponse(result, headers={"X-Request-Id": rid})
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Request-Id": rid})

    # ------------------------------------------------------------------------------------ generation
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body.model)
        check_ready()
        rid = client_request_id(body, request, "cmpl")
        return await respond(request, await until_disconnect(request, serving.completions(body, rid),
                                                             body.stream), rid)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model)
        check_ready()
        rid = client_request_id(body, request, "chatcmpl")
        return await respond(request, await until_disconnect(request, serving.chat(body, rid), body.stream), rid)

    # ------------------------------------------------------------------------------------ the rest
    @app.get("/v1/models")
    async def models() -> dict:
        info = engine.get_model_info()
        served = settings.model.served_model_name or [model_name]  # every --served-model-name is listed
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "octavo", "root": info.model, "parent": None,
                                            "max_model_len": info.max_model_len} for name in served]
                + [{"id": name, "object": "model", "created": 0, "owned_by": "octavo", "root": lr.lora_path,
                    "parent": model_name, "max_model_len": info.max_model_len} for name, lr in serving.loras.items()]}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        check_model(body.model)
        tok = engine.get_tokenizer()
        if tok is None:
            raise APIError(400, "This server runs without a tokenizer (skip_tokenizer_init).")
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "Give exactly one of 'prompt' (text) or 'messages' (chat).", param="prompt")
        if body.messages is not None:
            _, ids = await serving.render_chat(body, add_generation_prompt=body.add_generation_prompt)
        else:
            ids = await serving.encode(body.prompt, body.add_special_tokens)
        out = {"count": len(ids), "max_model_len": engine.get_model_info().max_model_len, "tokens": list(ids)}
        if body.return_token_strs:
            out["token_strs"] = tok.convert_ids_to_tokens(ids)
        return out

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        check_model(body.model)
        tok = engine.get_tokenizer()
        vocab = engine.get_model_info().vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"tokens {bad[:5]} are outside the vocabulary [0, {vocab}).", param="tokens")
        text = await run_bounded(lambda: tok.decode(body.tokens), timeout_s=RENDER_TIMEOUT_S, what="detokenizing",
                                 param="tokens")
        return {"prompt": text}

    @app.get("/health")
    async def health() -> Response:
        if engine.errored:
            return error_response(503, f"The engine is down: {_first_line(engine.dead_reason or '')}")
        return Response(status_code=200)

    # The guard is added last, so it is the outermost middleware (inside Starlette's own error net): body size
    # limit, draining after SIGTERM, and the JSON 500 that keeps the connection.
    app.state.server_state = ServerState()
    app.add_middleware(Guard, max_body_bytes=settings.server.max_request_body_bytes,
                       state=app.state.server_state)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        data, content_type = metrics.render()
        return Response(data, media_type=content_type)

    from octavo.server.embeddings import register_embedding_routes

    register_embedding_routes(app, engine, model_name, check_model, check_ready)  # and which routes fit the model
    from octavo.server.pooling_routes import register_pooling_routes

    register_pooling_routes(app, engine, model_name, check_model, check_ready)  # /pooling /classify /score /rerank
    register_ui_routes(app, engine, settings, model_name)  # /v1/octavo/info; /, /ui/, /dashboard unless --disable-ui
    from octavo.server.vllm_routes import register_vllm_routes

    register_vllm_routes(app, engine, settings, check_model)  # /v1/models/{id}, /tokenizer_info, /ping, /invocations
    from octavo.server.lora_routes import register_lora_routes

    register_lora_routes(app, settings, serving, names)  # /v1/load_lora_adapter, /v1/unload_lora_adapter (switch)
    from octavo.server.vllm_server import register_vllm_server

    # /v1/responses; dev-mode /sleep /wake_up /collective_rpc; request-id headers; request, access, throughput logs
    register_vllm_server(app, engine, settings, serving, check_model, check_ready)

    from octavo.core.plugin_manager import get_plugin_manager

    get_plugin_manager().hook.octavo_add_routes(app=app, engine=engine)
    return app


def _param_path(loc: Any) -> str | None:
    """A pydantic error location as the client's field path: ``("body", "messages", 0, "content")`` ->
    ``messages[0].content`` (union member names such as ``list[int]`` are dropped)."""
    path = ""
    for part in loc:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part not in _TYPE_NAMES:
            path += f".{part}" if path else part
    return path or None


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else "unknown reason"
