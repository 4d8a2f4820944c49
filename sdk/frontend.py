"""The request front end shared by ``LLMEngine`` and ``AsyncLLM``: one place that turns caller input into
core requests and core outputs back into ``RequestOutput`` objects.

It owns what both engines used to repeat: tokenizing and chat templates (``tokenize``, ``render_chat``),
validating once (``InputError`` names the request field at fault), fanning ``n > 1`` out into sequences,
the id scheme, aborting, and finishing a request that the core failed with its error.

Ids: the caller's id is never used as an internal id. Each submitted request gets
``<client id>-<random suffix>``, unique even when two callers pick the same id (or pick another
request's fan-out id, ``0_<id>``), and outputs carry the client's id again on the way out::

    client "r1" --submit--> internal "r1-9f2c..." --fan-out n=2--> core "0_r1-9f2c...", "1_r1-9f2c..."
    core outputs --process_outputs--> RequestOutput(request_id="r1-9f2c...") --client_id()--> "r1"
"""

from __future__ import annotations

import secrets
from typing import Any

from octavo.core.input_processor import InputProcessor
from octavo.core.messages import EngineCoreRequest
from octavo.core.output_processor import OutputProcessor
from octavo.errors import InputError
from octavo.sampling_params import SamplingParams

__all__ = ["FrontEnd", "InputError"]


class FrontEnd:
    """Tokenize, validate, fan out, track and finish requests for one engine (no I/O, no event loop).

    Args:
        settings: the engine's ``OctavoSettings``.
        tokenizer: the Hugging Face tokenizer, or None (``skip_tokenizer_init``).
        model_info: the core's ``ModelInfo`` (vocabulary, max_model_len, pooling, eos ids).
    """

    def __init__(self, settings: Any, tokenizer: Any, model_info: Any) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.model_info = model_info
        self._inputs = InputProcessor(settings, tokenizer, model_info)
        self._outputs = OutputProcessor(tokenizer)
        self._client_ids: dict[str, str] = {}  # internal id -> the caller's id
        self._mm = None  # octavo.core.multimodal.MultiModalPreprocessor, built on the first multimodal prompt
        self._pooling: dict[str, Any] = {}  # internal id -> PoolingParams of an unfinished pooling request
        from octavo.pooling import check_served_task

        check_served_task(settings, model_info)  # task=classify|score|reward, runner=generate vs the model

    # ------------------------------------------------------------------------------------ inputs
    def tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """A prompt (text, ids or a prompt dict) -> ``(text or None, token ids)``; refuses oversized text."""
        return self._inputs.tokenize(prompt)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (size-bounded like every prompt)."""
        if self.tokenizer is None:
            raise InputError("this engine runs without a tokenizer (skip_tokenizer_init).", "prompt")
        return self._inputs.encode(text, add_special_tokens=add_special_tokens)

    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, chat_template: str | None = None,
                    tools: list | None = None, chat_template_kwargs: dict | None = None) -> tuple[str, list[int]]:
        """Render a conversation with the chat template and tokenize it -> ``(text, token ids)``.

        Raises:
            InputError: bad messages, reserved ``chat_template_kwargs`` names, or a render failure.
        """
        return self._inputs.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
            chat_template=chat_template, tools=tools, template_kwargs=chat_template_kwargs)

    def check_task(self, pooling: bool) -> None:
        """Refuse generation on an embedding model and embeddings on a generative one."""
        info = self.model_info
        if info.is_pooling and not pooling:
            raise InputError(f"{info.architecture} is served as an embedding model; it cannot generate text. "
                             "Use embeddings (embed(), POST /v1/embeddings).", "model")
        if pooling and not info.is_pooling:
            raise InputError(f"{info.architecture} is a generative model; embeddings need an embedding model (or "
                             "start this one with task='embed' if its architecture supports it).", "model")

    def submit(self, client_id: str, prompt: Any, params: SamplingParams | None, priority: int = 0, *,
               pooling: bool = False, queue: Any = None,
               lora_request: Any = None, pooling_params: Any = None) -> tuple[str, list[EngineCoreRequest]]:
        """Validate one request and register it; returns its internal id and the core requests to send.

        A pooling request's ``pooling_params`` (``PoolingParams``; None: the ``embed`` defaults) are checked
        here and applied to its raw pooled vector in ``process_outputs`` (``octavo.pooling``).

        Nothing is registered when this raises (``InputError``), so the caller has nothing to undo.
        """
        params = params or SamplingParams()
        self.check_task(pooling)
        if pooling:
            from octavo.pooling import resolve

            pooling_params = resolve(pooling_params, getattr(pooling_params, "task", None) or "embed", self.model_info)
            if pooling_params.truncate_prompt_tokens is not None:
                params = SamplingParams(max_tokens=1, detokenize=False,
                                        truncate_prompt_tokens=pooling_params.truncate_prompt_tokens)
        internal_id = self._new_id(client_id)
        mm_inputs = None
        if isinstance(prompt, dict) and "multi_modal_data" in prompt:  # images: expand placeholders first
            prompt, mm_inputs = self._multimodal(prompt, params)
        text, ids, core_reqs = self._inputs.process(internal_id, prompt, params, priority, pooling=pooling)
        for r in core_reqs if mm_inputs else ():
            r.mm_inputs = mm_inputs
        if lora_request is not None:  # checked here, so a bad adapter fails this request only
            from octavo.lora.adapter import check_lora_request

            lora_request = check_lora_request(lora_request, self.settings, pooling)
            for r in core_reqs:
                r.lora_request = lora_request
        self._outputs.add_request(internal_id, text, ids, params, [r.request_id for r in core_reqs], queue)
        self._client_ids[internal_id] = client_id
        if pooling:
            self._pooling[internal_id] = pooling_params
        return internal_id, core_reqs

    def _multimodal(self, prompt: dict, params: SamplingParams) -> tuple[dict, list]:
        """A prompt dict with ``multi_modal_data`` -> (the same prompt as expanded token ids, its items)."""
        from octavo.core.multimodal import MultiModalPreprocessor

        if params.truncate_prompt_tokens is not None:
            raise InputError("truncate_prompt_tokens cannot be combined with multi_modal_data (it would cut "
                             "image placeholders).", "truncate_prompt_tokens")
        if self._mm is None:
            self._mm = MultiModalPreprocessor(self.settings, self.model_info)
        rest = {k: v for k, v in prompt.items() if k != "multi_modal_data"}
        text, ids = self.tokenize(rest)
        ids, items = self._mm.prepare(prompt, ids)
        rest.pop("prompt", None)
        return {**rest, "prompt_token_ids": ids, **({"prompt": text} if text is not None else {})}, items

    def split_chat_images(self, messages: list[dict]) -> tuple[list[dict], list]:
        """Chat messages with image_url parts -> (messages with placeholder text, images); a model that takes
        no images, a remote URL or a bad image is an ``InputError``. No image parts: returned unchanged."""
        from octavo.core.multimodal import MultiModalPreprocessor
        from octavo.core.multimodal_chat import has_image_parts, split_image_parts

        if not has_image_parts(messages):
            return messages, []
        if self._mm is None:
            self._mm = MultiModalPreprocessor(self.settings, self.model_info)
        if self._mm.processor is None:
            raise InputError(f"{self.model_info.architecture} takes no images; image content parts need a "
                             "vision-language model such as LLaVA-1.5.", "messages")
        from octavo.media_fetch import MediaFetcher

        fetcher = MediaFetcher.from_settings(self.settings)  # http(s) URLs of --allowed-media-domains only
        return split_image_parts(messages, self._mm.processor.placeholder_text, fetcher,
                                 getattr(self._mm.processor, "preprocess", None))

    def _new_id(self, client_id: str) -> str:
        while True:
            internal_id = f"{client_id}-{secrets.token_hex(8)}"
            if internal_id not in self._client_ids:
                return internal_id

    # ------------------------------------------------------------------------------------ tracking
    def client_id(self, internal_id: str) -> str:
        """The caller's id of a request (the internal id itself if it is no longer tracked)."""
        return self._client_ids.get(internal_id, internal_id)

    def internal_ids(self, client_id: str) -> list[str]:
        """Internal ids of the unfinished requests the caller submitted as ``client_id``."""
        return [i for i, c in self._client_ids.items() if c == client_id]

    def is_tracked(self, internal_id: str) -> bool:
        return internal_id in self._client_ids

    def has_unfinished(self) -> bool:
        return self._outputs.has_unfinished()

    def num_unfinished(self) -> int:
        return len(self._client_ids)

    def parent_of(self, seq_id: str) -> str | None:
        """The internal request id of a core sequence id (None once the request is gone)."""
        return self._outputs.seq_to_parent.get(seq_id)

    def abort(self, internal_ids: list[str]) -> list[str]:
        """Forget requests; returns the core sequence ids the caller must abort in the core."""
        seq_ids = [sid for rid in internal_ids for sid in self._outputs.seq_ids(rid)]
        for rid in internal_ids:
            self._outputs.abort_request(rid)
            self._client_ids.pop(rid, None)
            self._pooling.pop(rid, None)
        return seq_ids

    # ------------------------------------------------------------------------------------ outputs
    def process_outputs(self, core_outputs: list) -> tuple[list[tuple[str, Any, str | None]], list[str]]:
        """One step's core outputs -> ``[(internal id, output, error or None)]`` and the sequence ids to abort.

        Each output's ``request_id`` is the caller's id again; a request the core failed comes back
        finished, with the core's error message.
        """
        outs, to_abort = self._outputs.process_outputs(core_outputs)
        result = []
        for ro in outs:
            internal_id = ro.request_id
            err = self._outputs.errors.pop(internal_id, None)
            if ro.finished and internal_id in self._pooling:  # raw pooled vector -> the request's result
                from octavo.pooling import finish

                params = self._pooling.pop(internal_id)
                if not err and hasattr(ro.outputs, "embedding"):  # a failed request keeps its error output
                    ro = finish(ro, params, self.model_info.pooler)
            ro.request_id = self._client_ids.get(internal_id, internal_id)
            if err:  # the core names the internal id; the caller knows its own
                err = err.replace(internal_id, ro.request_id)
            if ro.finished:
                self._client_ids.pop(internal_id, None)
            result.append((internal_id, ro, err))
        return result, to_abort

    def reclaim(self, internal_id: str) -> None:
        """Forget a request's id mapping once its caller is done with it (finished, failed or aborted)."""
        self._client_ids.pop(internal_id, None)
        self._pooling.pop(internal_id, None)
