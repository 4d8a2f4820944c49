"""Spreading what ``LLM`` methods take (one prompt or many, one parameter object or one per prompt) into
per-prompt lists; shared by ``octavo.llm`` and ``octavo.llm_vllm``."""

from __future__ import annotations

from typing import Any

from octavo.sampling_params import SamplingParams


def _as_list(prompts: Any) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


def _per_prompt(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts; give one, or one per prompt.")
    return params


def _per_prompt_lora(lora: Any, n: int) -> list | None:
    if lora is None or not isinstance(lora, (list, tuple)):
        return [lora] * n if lora is not None else None
    if len(lora) != n:
        raise ValueError(f"got {len(lora)} LoRA requests for {n} prompts; give one, or one per prompt.")
    return list(lora)
