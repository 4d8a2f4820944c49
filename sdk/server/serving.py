"""The two generation routes: ``/v1/completions`` and ``/v1/chat/completions``, streaming (SSE) and not.

Each HTTP request becomes one ``AsyncLLM.generate`` call per prompt (``n`` is fanned out by the
engine). Streaming uses DELTA outputs, non-streaming FINAL_ONLY. A client that goes away cancels the
generator, which aborts the request in the core and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from octavo.errors import APIError
from octavo.outputs import RequestOutput
from octavo.server.beam import beam_generators, wants_beam_search
from octavo.server.errors import classify
from octavo.server.errors import stream_error as _stream_error
from octavo.server.offload import run_bounded
from octavo.server.protocol import ChatCompletionRequest, CompletionRequest
from octavo.server.structured import check_server_settings, structured_outputs_for
from octavo.server.tool_calls import ToolPlan
from octavo.server.vllm_fields import apply_generation_defaults, continuous_usage, prompt_logprobs_json

RENDER_TIMEOUT_S = 10.0  # a chat template render (or a prompt's tokenization) longer than this is a 400


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def merge(gens: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several generators as their outputs come; closes them all if the consumer stops."""
    if len(gens) == 1:
        async for out in gens[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, gen: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in gen:
                queue.put_nowait((i, out))
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def _iterate(stream: Any) -> AsyncIterator[RequestOutput]:
    try:
        async for out in stream:
            yield out
    finally:  # the consumer stopped (client gone, error): abort the request, free its KV blocks
        stream.close()


# ---------------------------------------------------------------------------------------------- logprobs
def _chat_logprobs(logprobs: list[dict[int, Any]], token_ids: list[int], k: int) -> list[dict[str, Any]]:
    content = []
    for pos, tid in zip(logprobs, token_ids):
        chosen = pos.get(tid)
        top = sorted((lp for lp in pos.values() if lp.rank is not None and lp.rank <= k), key=lambda x: x.rank)
        content.append({
            "token": chosen.decoded_token, "logprob": max(chosen.logprob, -9999.0),
            "bytes": list(chosen.decoded_token.encode("utf-8")),
            "top_logprobs": [{"token": lp.decoded_token, "logprob": max(lp.logprob, -9999.0),
                              "bytes": list(lp.decoded_token.encode("utf-8"))} for lp in top[:k]],
        })
    return content


def _completion_logprobs(entries: list[tuple[int, dict[int, Any] | None]], k: int, offset: int) -> dict[str, Any]:
    """OpenAI legacy logprobs: tokens, token_logprobs, top_logprobs (dicts text -> logprob), text_offset."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for tid, pos in entries:
        chosen = pos.get(tid) if pos else None
        text = chosen.decoded_token if chosen else None
        tokens.append(text if text is not None else "")
        token_lps.append(None if chosen is None else max(chosen.logprob, -9999.0))
        if pos is None:
            tops.append(None)
        else:
            ranked = sorted((lp for lp in pos.values() if lp.rank is not None and lp.rank <= k), key=lambda x: x.rank)
            top = {lp.decoded_token: max(lp.logprob, -9999.0) for lp in ranked[:k]}
            if chosen is not None:
                top.setdefault(chosen.decoded_token, max(chosen.logprob, -9999.0))
            tops.append(top)
        offsets.append(offset)
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


class OpenAIServing:
    """Builds responses for one engine; ``model_name`` is what responses report."""

    def __init__(self, engine: Any, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.loras: dict = {}  # model id -> LoRARequest (--lora-modules; set by the app)
        self.unloaded_loras: set = set()  # names unloaded at run time (lora_routes): 404, never the base model
        self.tokenizer = engine.get_tokenizer()
        check_server_settings(engine.settings)  # backend and parser names; warms the grammar library
        from octavo.generation_config import generation_defaults

        self.generation_defaults = generation_defaults(engine.settings)  # the model's, for fields a request omits
        self.trust_request_chat_template = bool(getattr(engine.settings.server, "trust_request_chat_template",
                                                        False))

    async def render_chat(self, req: Any, **kwargs: Any) -> tuple[str, list[int]]:
        """Render and tokenize a conversation off the event loop, time-bounded; a request's own template
        only with ``--trust-request-chat-template``."""
        template = getattr(req, "chat_template", None)
        if template is not None and not self.trust_request_chat_template:
            raise APIError(400, "chat_template in a request is refused: the server runs only its own template "
                           "(the operator may allow request templates with --trust-request-chat-template).",
                           param="chat_template")
        kwargs.setdefault("chat_template", template)
        return await run_bounded(lambda: self.engine.render_chat(req.messages, **kwargs), timeout_s=RENDER_TIMEOUT_S,
                                 what="rendering the chat template",
                                 param="chat_template" if template is not None else "messages")

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize off the event loop, time-bounded (and size-bounded by the front end)."""
        return await run_bounded(lambda: self.engine.encode(text, add_special_tokens=add_special_tokens),
                                 timeout_s=RENDER_TIMEOUT_S, what="tokenizing the prompt", param="prompt")

    @staticmethod
    def sampling_params(req: Any) -> Any:
        """``req.to_sampling_params()``, its errors naming the client's field (``max_completion_tokens``)."""
        try:
            return req.to_sampling_params()
        except ValueError as e:
            status, message, param = classify(e, req)
            raise APIError(status, message, param=param) from None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    def _submit(self, prompts: list[tuple[Any, str]], params: Any, priority: int, cache_salt: str | None = None,
                model: str | None = None) -> list:
        """Validate and queue every prompt now (so bad input is a 400 before any byte is sent); all or none."""
        if model in self.unloaded_loras and model not in self.loras:  # unloaded after the route's model check
            raise APIError(404, f"The model {model!r} does not exist (its LoRA adapter was unloaded).",
                           param="model", code="model_not_found")
        streams = []
        try:
            for prompt, rid in prompts:
                if cache_salt is not None:
                    prompt = {**prompt, "cache_salt": cache_salt}
                streams.append(self.engine.add_request(prompt, params, rid, priority,
                                                       lora_request=self.loras.get(model)))
        except BaseException:
            for st in streams:
                st.close()
            raise
        return [_iterate(st) for st in streams]

    def _prompt_logprob_entries(self, out: RequestOutput) -> list[tuple[int, dict | None]]:
        plp = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
        return list(zip(out.prompt_token_ids, plp))

    # ------------------------------------------------------------------------------------ completions
    async def completions(self, req: CompletionRequest, request_id: str) -> dict | AsyncIterator[str]:
        params = self.sampling_params(apply_generation_defaults(req, self.generation_defaults))
        params.structured_outputs = structured_outputs_for(req, self.engine.settings.scheduler.structured_outputs_backend)
        if req.echo and req.logprobs is not None and params.prompt_logprobs is None:
            params.prompt_logprobs = req.logprobs
        prompts = req.prompts()
        gens = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, list):
                prompt = {"prompt_token_ids": prompt}
            elif self.tokenizer is not None:
                prompt = {"prompt_token_ids": await self.encode(prompt, req.add_special_tokens), "prompt": prompt}
            gens.append((prompt, f"{request_id}-{i}"))
        gens = (beam_generators(self, req, params, gens) if wants_beam_search(req) else  # use_beam_search
                self._submit(gens, params, req.priority, req.cache_salt, model=req.model))
        created = int(time.time())
        if req.stream:
            return self._completion_stream(req, request_id, created, gens, params.n)
        finals: dict[int, RequestOutput] = {}
        async for i, out in merge(gens):
            finals[i] = out
        choices, n_prompt, n_gen = [], 0, 0
        for i in range(len(prompts)):
            out = finals[i]
            n_prompt += len(out.prompt_token_ids)
            prompt_text = out.prompt if out.prompt is not None else self._decode(out.prompt_token_ids)
            for c in sorted(out.outputs, key=lambda c: c.index):
                n_gen += len(c.token_ids)
                text = (prompt_text + c.text) if req.echo else c.text
                lp = None
                if req.logprobs is not None:
                    entries = [(t, d) for t, d in zip(c.token_ids, c.logprobs or [])]
                    if req.echo:
                        entries = self._prompt_logprob_entries(out) + entries
                    lp = _completion_logprobs(entries, req.logprobs, 0)
                choice = {"index": i * params.n + c.index, "text": text, "logprobs": lp,
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                if req.return_token_ids:
                    choice.update(token_ids=c.token_ids, prompt_token_ids=out.prompt_token_ids)
                if req.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
                choices.append(choice)
        return {"id": request_id, "object": "text_completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": _usage(n_prompt, n_gen)}

    async def _completion_stream(self, req: CompletionRequest, request_id: str, created: int,
                                 gens: list, n: int) -> AsyncIterator[str]:
        n_prompt: dict[int, int] = {}
        n_gen = 0
        echoed: set[int] = set()
        offsets: dict[int, int] = {}
        try:
            async for i, out in merge(gens):
                n_prompt[i] = len(out.prompt_token_ids)
                for c in out.outputs:
                    idx = i * n + c.index
                    text = c.text
                    entries = [(t, d) for t, d in zip(c.token_ids, c.logprobs or [])]
                    if req.echo and idx not in echoed:
                        echoed.add(idx)
                        text = (out.prompt if out.prompt is not None else self._decode(out.prompt_token_ids)) + text
                        if req.logprobs is not None:
                            entries = self._prompt_logprob_entries(out) + entries
                    n_gen += len(c.token_ids)
                    if not text and not c.token_ids and c.finish_reason is None:
                        continue
                    lp = None
                    if req.logprobs is not None:
                        lp = _completion_logprobs(entries, req.logprobs, offsets.get(idx, 0))
                        offsets[idx] = offsets.get(idx, 0) + sum(len(t) for t in lp["tokens"])
                    choice = {"index": idx, "text": text, "logprobs": lp, "finish_reason": c.finish_reason,
                              "stop_reason": c.stop_reason}
                    if req.return_token_ids:
                        choice["token_ids"] = c.token_ids
                    chunk = {"id": request_id, "object": "text_completion", "created": created,
                             "model": self.model_name, "choices": [choice],
                             **continuous_usage(req, sum(n_prompt.values()), n_gen)}
                    yield _sse(chunk)
            if req.include_usage:
                yield _sse({"id": request_id, "object": "text_completion", "created": created,
                            "model": self.model_name, "choices": [],
                            "usage": _usage(sum(n_prompt.values()), n_gen)})
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band, as vLLM does
            yield _sse(stream_error(e, req))
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------------------------------ chat
    async def chat(self, req: ChatCompletionRequest, request_id: str) -> dict | AsyncIterator[str]:
        params = self.sampling_params(apply_generation_defaults(req, self.generation_defaults))
        plan = ToolPlan.from_request(req, self.engine.settings, self.tokenizer)  # tools, tool_choice, reasoning
        params.structured_outputs = structured_outputs_for(
            req, self.engine.settings.scheduler.structured_outputs_backend, plan.constraint)
        params.skip_special_tokens = params.skip_special_tokens and not plan.needs_special_tokens
        req.messages, images = await run_bounded(  # image_url parts: decoded (or fetched) off the event loop
            lambda: self.engine.frontend.split_chat_images(req.messages), what="loading the request's images",
            timeout_s=self.engine.settings.model.media_fetch_timeout * 4 + RENDER_TIMEOUT_S, param="messages")
        text, ids = await self.render_chat(
            req, add_generation_prompt=req.add_generation_prompt, continue_final_message=req.continue_final_message,
            tools=plan.template_tools, chat_template_kwargs=req.chat_template_kwargs)
        mm = {"multi_modal_data": {"image": images}} if images else {}
        prompts = [({"prompt_token_ids": ids, "prompt": text, **mm}, request_id)]
        gens = (beam_generators(self, req, params, prompts) if wants_beam_search(req) else  # use_beam_search
                self._submit(prompts, params, req.priority, req.cache_salt, model=req.model))
        created = int(time.time())
        k = req.top_logprobs or 0
        if req.stream:
            return self._chat_stream(req, request_id, created, gens, k, plan)
        final = None
        async for _, out in merge(gens):
            final = out
        choices, n_gen = [], 0
        for c in sorted(final.outputs, key=lambda c: c.index):
            n_gen += len(c.token_ids)
            message, called = plan.reader().message(c.text)
            choice = {"index": c.index, "message": message,
                      "logprobs": {"content": _chat_logprobs(c.logprobs, c.token_ids, k)} if req.logprobs else None,
                      "finish_reason": "tool_calls" if called and c.finish_reason == "stop" else c.finish_reason,
                      "stop_reason": c.stop_reason}
            if req.return_token_ids:
                choice["token_ids"] = c.token_ids
            choices.append(choice)
        resp = {"id": request_id, "object": "chat.completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": _usage(len(final.prompt_token_ids), n_gen)}
        if req.return_token_ids:
            resp["prompt_token_ids"] = final.prompt_token_ids
        if req.prompt_logprobs is not None:
            resp["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs)
        return resp

    async def _chat_stream(self, req: ChatCompletionRequest, request_id: str, created: int, gens: list,
                           k: int, plan: ToolPlan) -> AsyncIterator[str]:
        base = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
        started: set[int] = set()
        readers: dict[int, Any] = {}  # choice index -> ChoiceReader (content / reasoning / tool-call deltas)
        n_prompt = n_gen = 0
        try:
            async for _, out in merge(gens):
                n_prompt = len(out.prompt_token_ids)
                for c in out.outputs:
                    if c.index not in started:  # OpenAI sends the role first, alone
                        started.add(c.index)
                        yield _sse({**base, "choices": [{"index": c.index, "delta": {"role": "assistant",
                                                                                     "content": ""},
                                                         "logprobs": None, "finish_reason": None}]})
                    n_gen += len(c.token_ids)
                    if not c.text and not c.token_ids and c.finish_reason is None:
                        continue
                    reader = readers.setdefault(c.index, plan.reader())
                    deltas = reader.deltas(c.text, final=c.finish_reason is not None) or [{}]
                    for j, delta in enumerate(deltas):
                        first, last = j == 0, j == len(deltas) - 1
                        finish = c.finish_reason if last else None
                        if finish == "stop" and reader.called_tools:
                            finish = "tool_calls"
                        choice = {"index": c.index, "delta": delta,
                                  "logprobs": {"content": _chat_logprobs(c.logprobs or [], c.token_ids, k)}
                                  if req.logprobs and first else None,
                                  "finish_reason": finish}
                        if finish is not None:
                            choice["stop_reason"] = c.stop_reason
                        if req.return_token_ids and first:
                            choice["token_ids"] = c.token_ids
                        yield _sse({**base, "choices": [choice], **continuous_usage(req, n_prompt, n_gen)})
            if req.include_usage:
                yield _sse({**base, "choices": [], "usage": _usage(n_prompt, n_gen)})
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
            yield _sse(stream_error(e, req))
        yield "data: [DONE]\n\n"


def stream_error(e: BaseException, req: Any = None) -> dict[str, Any]:
    """An error inside an SSE stream (after the 200 was sent), in OpenAI's error shape (see ``errors``)."""
    return _stream_error(e, req)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
