"""``LLMEngine``: the synchronous, in-process engine for callers that drive steps themselves.

    engine = LLMEngine.from_kwargs(model="path/or/model.gguf", max_num_seqs=8)
    engine.add_request("r1", "Hello", SamplingParams(max_tokens=16))
    while engine.has_unfinished_requests():
        for out in engine.step():
            ...
"""

from __future__ import annotations

from typing import Any

from octavo.config import OctavoSettings
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams


class LLMEngine:
    """Engine core, input processor and output processor in one process.

    Args:
        settings: the full engine settings (see :class:`octavo.config.OctavoSettings`).
    """

    def __init__(self, settings: OctavoSettings) -> None:
        from octavo.core.engine_core import EngineCore
        from octavo.core.loader import load_tokenizer
        from octavo.frontend import FrontEnd

        self.settings = settings
        self.tokenizer = None if settings.model.skip_tokenizer_init else load_tokenizer(settings.model)
        self.core = EngineCore(settings)
        self.model_info = self.core.model_info
        self.frontend = FrontEnd(settings, self.tokenizer, self.model_info)
        self._ids: dict[str, str] = {}  # the caller's id -> internal id, while unfinished

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> LLMEngine:
        """Build from flat vLLM-style engine arguments (``model=..., max_num_seqs=...``)."""
        return cls(OctavoSettings.from_kwargs(**kwargs))

    @classmethod
    def from_engine_args(cls, engine_args: Any) -> LLMEngine:
        """Build from an ``octavo.EngineArgs`` (vLLM's idiom)."""
        from octavo.engine_args import settings_from_engine_args

        return cls(settings_from_engine_args(engine_args))

    def get_tokenizer(self):
        return self.tokenizer

    def render_chat(self, messages: list[dict], **kwargs: Any) -> tuple[str, list[int]]:
        """Render a conversation with the chat template -> ``(text, token ids)`` (see ``FrontEnd.render_chat``)."""
        return self.frontend.render_chat(messages, **kwargs)

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams | None = None,
                    priority: int = 0, lora_request: Any = None) -> None:
        """Queue a request. Raises ``ValueError`` (and queues nothing) if the prompt or parameters are invalid.

        Args:
            request_id: unique id of this request (among this engine's unfinished requests).
            prompt: a string, a list of token ids, ``{"prompt": ...}`` or ``{"prompt_token_ids": [...]}``.
            params: sampling parameters (default: ``SamplingParams()``).
            priority: lower runs first under ``scheduling_policy="priority"``.
        """
        self._add(request_id, prompt, params or SamplingParams(), priority, pooling=False, lora_request=lora_request)

    def add_embedding_request(self, request_id: str, prompt: Any, priority: int = 0,
                              pooling_params: Any = None) -> None:
        """Queue a pooling request (pooling models only): ``pooling_params`` (a ``PoolingParams`` whose ``task``
        is set; None: ``embed``). Its output is an ``EmbeddingRequestOutput`` (embed) or ``PoolingRequestOutput``."""
        self._add(request_id, prompt, SamplingParams(max_tokens=1, detokenize=False), priority, pooling=True,
                  pooling_params=pooling_params)

    def _add(self, request_id: str, prompt: Any, params: SamplingParams, priority: int, pooling: bool,
             lora_request: Any = None, pooling_params: Any = None) -> None:
        if request_id in self._ids:
            raise ValueError(f"request id {request_id!r} is already in use; pass a unique id.")
        internal_id, core_reqs = self.frontend.submit(request_id, prompt, params, priority, pooling=pooling,
                                                      lora_request=lora_request, pooling_params=pooling_params)
        added = []
        try:
            for r in core_reqs:
                self.core.add_request(r)
                added.append(r.request_id)
        except ValueError:
            self.core.abort_requests(added)
            self.frontend.abort([internal_id])
            raise
        self._ids[request_id] = internal_id

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Stop requests; their KV blocks are freed at once."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        internal = [self._ids.pop(rid) for rid in ids if rid in self._ids]
        self.core.abort_requests(self.frontend.abort(internal))

    def has_unfinished_requests(self) -> bool:
        return self.frontend.has_unfinished() or self.core.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """Run one engine step and return the outputs it produced (a request the core failed finishes with
        ``finish_reason="error"``)."""
        core_out = self.core.step()
        results, to_abort = self.frontend.process_outputs(core_out.outputs)
        if to_abort:
            self.core.abort_requests(to_abort)
        for _, out, _err in results:
            if out.finished:
                self._ids.pop(out.request_id, None)
        return [out for _, out, _ in results]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block. Returns False (and changes nothing) while requests hold blocks."""
        from octavo.core.engine_core_proc import reset_prefix_cache

        return reset_prefix_cache(self.core)

    def get_stats(self):
        """Scheduler statistics (running, waiting, KV usage, prefix-cache hits, preemptions)."""
        return self.core.get_stats()

    def shutdown(self) -> None:
        self.core.shutdown()
