"""``/v1/responses``: the OpenAI Responses API, the subset vLLM serves — create (plain and streamed), retrieve.

A request becomes a chat completion (``OpenAIServing.chat``): ``instructions`` -> a system message,
``input`` (text or message items with ``input_text`` / ``output_text`` / ``input_image`` parts) -> messages,
``previous_response_id`` -> the stored conversation before them, ``max_output_tokens`` -> max_tokens,
``text.format`` json_schema -> structured output. The answer is one ``message`` output item with one
``output_text`` part. Streaming sends the Responses event sequence (``response.created`` ...
``response.output_text.delta`` ... ``response.completed``), each with its ``sequence_number``.

Stored (``store``, default true): the last :data:`MAX_STORED` responses, in memory, for ``GET
/v1/responses/{id}`` and ``previous_response_id``. Refused with a 400 naming the field: tools, reasoning,
background, include, truncation="auto", conversation, prompt (templates) — not built. Other unknown fields are
accepted with a one-time warning, as on the other routes.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ConfigDict, Field

from octavo.errors import APIError
from octavo.server.disconnect import until_disconnect
from octavo.server.protocol import I32, ChatCompletionRequest, StreamOptions, _Checked

logger = logging.getLogger("octavo.server")
MAX_STORED = 1000
# field -> its no-op values: anything else is refused (not built here)
_REFUSED = {"tools": (None, []), "reasoning": (None,), "background": (None, False), "include": (None, []),
            "conversation": (None,), "prompt": (None,), "truncation": (None, "disabled"),
            "top_logprobs": (None, 0), "max_tool_calls": (None,)}
_WARNED: set[str] = set()


class ResponsesRequest(_Checked):
    """``POST /v1/responses`` (the fields octavo reads; see the module docstring for the refused ones)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(...)
    instructions: str | None = None
    max_output_tokens: I32 | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    text: dict[str, Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    user: str | None = None
    service_tier: str | None = None
    request_id: str | None = None


def _messages(req: ResponsesRequest, history: list[dict]) -> list[dict]:
    msgs = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + list(history)
    if isinstance(req.input, str):
        return msgs + [{"role": "user", "content": req.input}]
    for i, item in enumerate(req.input):
        kind = item.get("type", "message")
        if kind != "message" or "role" not in item:
            raise APIError(400, f"input[{i}] of type {kind!r} is not supported; send message items (role + "
                           "content).", param=f"input[{i}].type")
        content = item.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                ptype = part.get("type") if isinstance(part, dict) else None
                if ptype in ("input_text", "output_text", "text"):
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif ptype == "input_image" and isinstance(part.get("image_url"), str):
                    parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
                else:
                    raise APIError(400, f"input[{i}].content[{j}] of type {ptype!r} is not supported (input_text, "
                                   "output_text, input_image with image_url).", param=f"input[{i}].content[{j}]")
            content = parts if any(p["type"] == "image_url" for p in parts) else "".join(p["text"] for p in parts)
        msgs.append({"role": item["role"], "content": content})
    return msgs


def _chat_request(req: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    body: dict[str, Any] = {"model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
                            "temperature": req.temperature, "top_p": req.top_p, "stream": req.stream}
    if req.stream:
        body["stream_options"] = StreamOptions(include_usage=True)
    fmt = (req.text or {}).get("format")
    if fmt and fmt.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "schema"), "schema": fmt.get("schema", {}), "strict": fmt.get("strict")}}
    elif fmt and fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt and fmt.get("type") != "text":
        raise APIError(400, f"text.format type {fmt.get('type')!r} is not supported (text, json_schema, "
                       "json_object).", param="text.format")
    if req.tool_choice not in (None, "auto", "none"):
        raise APIError(400, "tool_choice needs tools, which /v1/responses does not serve here.", param="tool_choice")
    return ChatCompletionRequest(**{k: v for k, v in body.items() if v is not None})


class ResponsesAPI:
    """Turns Responses requests into chat completions and keeps the stored responses."""

    def __init__(self, serving: Any) -> None:
        self.serving = serving
        self.stored: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()  # id -> (response, conversation)

    def check_fields(self, req: ResponsesRequest) -> None:
        for name, value in (req.model_extra or {}).items():
            noop = _REFUSED.get(name)
            if noop is not None:
                if not any(value == v and type(value) is type(v) or value is v for v in noop):
                    raise APIError(400, f"{name} is not supported on /v1/responses by octavo.", param=name)
            elif name not in _WARNED:
                _WARNED.add(name)
                logger.warning("The /v1/responses field %r is not used by octavo and was ignored (logged once).",
                               name[:64])

    def _store(self, resp: dict, conversation: list[dict]) -> None:
        self.stored[resp["id"]] = (resp, conversation)
        while len(self.stored) > MAX_STORED:
            self.stored.popitem(last=False)

    def _base(self, req: ResponsesRequest, rid: str, status: str) -> dict:
        return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
                "model": self.serving.model_name, "output": [], "error": None, "incomplete_details": None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "temperature": req.temperature, "top_p": req.top_p, "tools": [], "tool_choice": "auto",
                "parallel_tool_calls": req.parallel_tool_calls, "metadata": req.metadata or {},
                "previous_response_id": req.previous_response_id, "store": req.store, "truncation": "disabled",
                "text": req.text or {"format": {"type": "text"}}, "reasoning": None, "user": req.user,
                "usage": None}

    @staticmethod
    def _finish(resp: dict, msg_id: str, text: str, finish_reason: str | None, usage: dict) -> dict:
        resp["output"] = [{"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}]
        resp["status"] = "incomplete" if finish_reason == "length" else "completed"
        resp["incomplete_details"] = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        resp["usage"] = {"input_tokens": usage.get("prompt_tokens", 0), "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": usage.get("completion_tokens", 0),
                         "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": usage.get("total_tokens", 0)}
        return resp

    async def create(self, req: ResponsesRequest, rid: str) -> dict | AsyncIterator[str]:
        """``rid``: the engine's request id (the client's X-Request-Id, else new); the response's own id is
        always a fresh ``resp_...`` (what retrieve and previous_response_id use)."""
        self.check_fields(req)
        history: list[dict] = []
        if req.previous_response_id is not None:
            prev = self.stored.get(req.previous_response_id)
            if prev is None:
                raise APIError(404, f"Response {req.previous_response_id!r} not found (stored responses only).",
                               param="previous_response_id")
            history = prev[1]
        messages = _messages(req, history)
        chat = _chat_request(req, messages)
        result = await self.serving.chat(chat, rid)
        msg_id, resp_id = f"msg_{uuid.uuid4().hex}", f"resp_{uuid.uuid4().hex}"
        if not req.stream:
            choice = result["choices"][0]
            text = choice["message"].get("content") or ""
            resp = self._finish(self._base(req, resp_id, "completed"), msg_id, text, choice["finish_reason"],
                                result["usage"])
            if req.store:
                self._store(resp, [m for m in messages if m["role"] != "system"] + [
                    {"role": "assistant", "content": text}])
            return resp
        return self._stream(req, resp_id, msg_id, messages, result)

    async def _stream(self, req: ResponsesRequest, resp_id: str, msg_id: str, messages: list[dict],
                      chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        seq = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal seq
            seq += 1
            data = json.dumps({"type": kind, "sequence_number": seq - 1, **fields}, ensure_ascii=False)
            return f"event: {kind}\ndata: {data}\n\n"

        resp = self._base(req, resp_id, "in_progress")
        item = {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": msg_id, "output_index": 0, "content_index": 0}
        yield event("response.created", response=resp)
        yield event("response.in_progress", response=resp)
        yield event("response.output_item.added", output_index=0, item=item)
        yield event("response.content_part.added", **where, part=part)
        text, finish, usage = "", None, {}
        async for raw in chunks:
            if not raw.startswith("data: ") or raw.startswith("data: [DONE]"):
                continue
            chunk = json.loads(raw[6:])
            if "error" in chunk:
                resp["status"], resp["error"] = "failed", {"code": "server_error",
                                                           "message": str(chunk["error"].get("message"))}
                yield event("response.failed", response=resp)
                return
            usage = chunk.get("usage") or usage
            for c in chunk.get("choices") or []:
                delta = (c.get("delta") or {}).get("content") or ""
                if delta:
                    text += delta
                    yield event("response.output_text.delta", **where, delta=delta, logprobs=[])
                finish = c.get("finish_reason") or finish
        yield event("response.output_text.done", **where, text=text, logprobs=[])
        yield event("response.content_part.done", **where, part={**part, "text": text})
        resp = self._finish(resp, msg_id, text, finish, usage)
        yield event("response.output_item.done", output_index=0, item=resp["output"][0])
        if req.store:
            self._store(resp, [m for m in messages if m["role"] != "system"] + [{"role": "assistant", "content": text}])
        yield event("response.completed", response=resp)  # status inside may be "incomplete", as vLLM sends it


def register_responses_routes(app: FastAPI, serving: Any, check_model: Any, check_ready: Any) -> None:
    """``POST /v1/responses``, ``GET /v1/responses/{response_id}``."""
    api = ResponsesAPI(serving)
    app.state.responses = api

    @app.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        check_model(body.model)
        check_ready()
        rid = body.request_id or request.headers.get("x-request-id") or f"resp_{uuid.uuid4().hex}"
        result = await until_disconnect(request, api.create(body, rid), body.stream)
        if isinstance(result, Response):  # 499: the client went away
            return result
        if isinstance(result, dict):
            return JSONResponse(result, headers={"X-Request-Id": rid})
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": rid})

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> dict:
        found = api.stored.get(response_id)
        if found is None:
            raise APIError(404, f"Response {response_id!r} not found (stored responses only).",
                           param="response_id")
        return found[0]
