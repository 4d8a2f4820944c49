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
        from octavo.core.input_processor import InputProcessor
        from octavo.core.loader import load_tokenizer
        from octavo.core.output_processor import OutputProcessor

        self.settings = settings
        self.tokenizer = None if settings.model.skip_tokenizer_init else load_tokenizer(settings.model)
        self.core = EngineCore(settings)
        self.model_info = self.core.model_info
        self.input_processor = InputProcessor(settings, self.tokenizer, self.model_info)
        self.output_processor = OutputProcessor(self.tokenizer)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> LLMEngine:
        """Build from flat vLLM-style engine arguments (``model=..., max_num_seqs=...``)."""
        return cls(OctavoSettings.from_kwargs(**kwargs))

    def get_tokenizer(self):
        return self.tokenizer

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams | None = None,
                    priority: int = 0) -> None:
        """Queue a request. Raises ``ValueError`` (and queues nothing) if the prompt or parameters are invalid.

        Args:
            request_id: unique id of this request.
            prompt: a string, a list of token ids, ``{"prompt": ...}`` or ``{"prompt_token_ids": [...]}``.
            params: sampling parameters (default: ``SamplingParams()``).
            priority: lower runs first under ``scheduling_policy="priority"``.
        """
        params = params or SamplingParams()
        if self.model_info.is_pooling:
            raise ValueError(f"{self.model_info.architecture} is served as an embedding model; it cannot generate "
                             "text. Use embed() / add_embedding_request().")
        self._add(request_id, prompt, params, priority, pooling=False)

    def add_embedding_request(self, request_id: str, prompt: Any, priority: int = 0) -> None:
        """Queue an embedding request (embedding models only); its output is an ``EmbeddingRequestOutput``."""
        if not self.model_info.is_pooling:
            raise ValueError(f"{self.model_info.architecture} is a generative model; embeddings need an embedding "
                             "model (or start this one with task='embed' if its architecture supports it).")
        self._add(request_id, prompt, SamplingParams(max_tokens=1, detokenize=False), priority, pooling=True)

    def _add(self, request_id: str, prompt: Any, params: SamplingParams, priority: int, pooling: bool) -> None:
        if request_id in self.output_processor.parents:
            raise ValueError(f"request id {request_id!r} is already in use; pass a unique id.")
        text, ids, core_reqs = self.input_processor.process(request_id, prompt, params, priority, pooling=pooling)
        added = []
        try:
            for r in core_reqs:
                self.core.add_request(r)
                added.append(r.request_id)
        except ValueError:
            self.core.abort_requests(added)
            raise
        self.output_processor.add_request(request_id, text, ids, params, [r.request_id for r in core_reqs])

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Stop requests; their KV blocks are freed at once."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        seq_ids = [sid for rid in ids for sid in self.output_processor.seq_ids(rid)]
        self.core.abort_requests(seq_ids)
        for rid in ids:
            self.output_processor.abort_request(rid)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished() or self.core.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """Run one engine step and return the outputs it produced."""
        core_out = self.core.step()
        outputs, to_abort = self.output_processor.process_outputs(core_out.outputs)
        if to_abort:
            self.core.abort_requests(to_abort)
        return outputs

    def get_stats(self):
        """Scheduler statistics (running, waiting, KV usage, prefix-cache hits, preemptions)."""
        return self.core.get_stats()

    def shutdown(self) -> None:
        self.core.shutdown()
