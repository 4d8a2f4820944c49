"""``LLM``: the offline SDK — generate, chat and embed over batches of prompts, vLLM-compatible.

    from octavo import LLM, SamplingParams
    llm = LLM()                                  # the embedded default model, SmolLM2-135M-Instruct
    for out in llm.generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=32)):
        print(out.outputs[0].text)
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

from octavo.llm_pooling import PoolingLLMMethods
from octavo.llm_vllm import VllmLLMMethods
from octavo.outputs import RequestOutput
from octavo.prompt_batch import _as_list, _per_prompt, _per_prompt_lora
from octavo.sampling_params import RequestOutputKind, SamplingParams


class LLM(PoolingLLMMethods, VllmLLMMethods):  # + embed/classify/score/reward (llm_pooling); + encode, enqueue/wait_for_completion, start/stop_profile, beam_search
    """An engine for offline batches.

    Args:
        model: a local directory, a ``.gguf`` file or a Hugging Face repo id; None is the embedded default.
        **kwargs: any engine setting by its vLLM name (``dtype``, ``max_model_len``, ``max_num_seqs``,
            ``block_size``, ``enable_prefix_caching``, ``kv_cache_memory_bytes``, ``seed``, ...).
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        from octavo.config import OctavoSettings
        from octavo.llm_engine import LLMEngine

        self.llm_engine = LLMEngine(OctavoSettings.from_kwargs(model=model, **kwargs))
        self._counter = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: Any) -> LLM:
        """Build from an ``octavo.EngineArgs`` (vLLM's idiom); arguments left ``None`` keep their defaults."""
        return cls(**engine_args.given())

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_metrics(self) -> list:
        """The engine's metrics with the ``/metrics`` names (``octavo:...``; counters cumulative) as plain
        values: ``Counter``, ``Gauge`` and ``Vector`` from :mod:`octavo.metrics`, like vLLM's."""
        from octavo.metrics import metrics_from_stats

        return metrics_from_stats(self.llm_engine.get_stats())

    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: list[int] | None = None,
                 lora_request: Any = None) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in the order of ``prompts``.

        Args:
            prompts: a prompt or a list of them — strings, token-id lists, ``{"prompt": ...}`` or
                ``{"prompt_token_ids": [...]}`` dicts.
            sampling_params: one for all prompts or one per prompt (default ``SamplingParams()``).
            use_tqdm: show a progress bar with tokens/s.
            priority: per-prompt priority (with ``scheduling_policy="priority"``).
            lora_request: a ``LoRARequest`` for all prompts or a list with one (or None) per prompt
                (needs ``enable_lora``).

        Raises:
            ValueError: a prompt or parameter is invalid; nothing of this call is left running.
        """
        prompts = _as_list(prompts)
        params = _per_prompt(sampling_params if sampling_params is not None else self.get_default_sampling_params(),
                             len(prompts))
        loras = _per_prompt_lora(lora_request, len(prompts))
        return self._run([(p, sp) for p, sp in zip(prompts, params)], use_tqdm, priority, loras)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params=None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list | None = None,
             chat_template_kwargs: dict | None = None, lora_request: Any = None) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, using the model's chat template.

        Args:
            messages: ``[{"role": "user", "content": "..."}]`` or a list of such conversations.
            sampling_params: one for all or one per conversation.
            chat_template: a Jinja template string overriding the model's.
        """
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conv in conversations:
            conv, images = self.llm_engine.frontend.split_chat_images(conv)  # image_url parts (data: URLs)
            text, ids = self.llm_engine.render_chat(conv, add_generation_prompt=add_generation_prompt,
                                                    continue_final_message=continue_final_message,
                                                    chat_template=chat_template, tools=tools,
                                                    chat_template_kwargs=chat_template_kwargs)
            prompts.append({"prompt": text, "prompt_token_ids": ids,
                            **({"multi_modal_data": {"image": images}} if images else {})})
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams`` with the model's ``generation_config.json`` defaults (``generation_config="auto"``),
        used by ``generate`` when none are given; plain ``SamplingParams()`` when the model has none."""
        from octavo.generation_config import generation_defaults

        return SamplingParams(**generation_defaults(self.llm_engine.settings))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False (nothing changed) while requests still hold blocks."""
        return self.llm_engine.reset_prefix_cache()

    def _run(self, items: list[tuple[Any, SamplingParams]], use_tqdm: bool, priority,
             loras: list | None = None) -> list[RequestOutput]:
        from octavo.core.gc_heap import frozen_heap

        # the scope covers the requests' admission too: a full collection due while 256 requests are added would
        # walk the whole heap before the first step (the scope of _collect nests in this one)
        with frozen_heap():
            return self._add_and_collect(self.llm_engine, items, priority, loras, use_tqdm)

    def _add_and_collect(self, engine, items, priority, loras, use_tqdm) -> list[RequestOutput]:
        ids = []
        try:
            for i, (prompt, sp) in enumerate(items):
                if sp.output_kind != RequestOutputKind.FINAL_ONLY:
                    sp = sp.clone()
                    sp.output_kind = RequestOutputKind.FINAL_ONLY
                rid = str(next(self._counter))
                engine.add_request(rid, prompt, sp, priority[i] if priority else 0,
                                   lora_request=loras[i] if loras else None)
                ids.append(rid)
        except ValueError:
            engine.abort_request(ids)
            raise
        return self._collect(ids, use_tqdm)

    def _collect(self, ids: list[str], use_tqdm: bool) -> list:
        """Step the engine until every request in ``ids`` finished; results in the order of ``ids``."""
        engine = self.llm_engine
        results: dict[str, Any] = {}
        bar = _progress(len(ids)) if use_tqdm else None
        from octavo.core.gc_heap import frozen_heap

        start, num_out = time.perf_counter(), 0
        try:
            with frozen_heap():  # full GC passes skip the engine's start-up heap while it steps (core/gc_heap.py)
                while engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.finished:
                            results[out.request_id] = out
                            if bar is not None:
                                if isinstance(out, RequestOutput):
                                    num_out += sum(len(c.token_ids) for c in out.outputs)
                                bar.set_postfix_str(f"{num_out / (time.perf_counter() - start):.1f} tok/s",
                                                    refresh=False)
                                bar.update(1)
        except BaseException:
            engine.abort_request([r for r in ids if r not in results])
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[r] for r in ids]


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
