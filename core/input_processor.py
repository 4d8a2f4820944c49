"""Front-end side of inputs: prompts -> validated ``EngineCoreRequest``s.

Accepts what vLLM accepts — a string, ``{"prompt": str}``, ``{"prompt_token_ids": [...]}`` — applies chat
templates, checks every limit the engine would trip over (so errors are ``ValueError``s naming the
problem, raised before anything reaches the core), and fans a request with ``n > 1`` out into ``n``
sequences with distinct seeds.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from octavo.core.messages import EngineCoreRequest, ModelInfo
from octavo.sampling_params import SamplingParams


def child_seed(seed: int, index: int) -> int:
    """Seed of sequence ``index`` of a seeded ``n > 1`` request; sequence 0 keeps the request's seed."""
    if index == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest(), "little") >> 1


def seq_ids_for(request_id: str, n: int) -> list[str]:
    return [request_id] if n == 1 else [f"{i}_{request_id}" for i in range(n)]


class InputProcessor:
    def __init__(self, settings, tokenizer, model_info: ModelInfo) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.model_info = model_info
        self.max_logprobs = settings.scheduler.max_logprobs
        self.chat_template = None
        if settings.model.chat_template:
            path = Path(settings.model.chat_template)
            if not path.is_file():
                raise ValueError(f"chat_template file {path} does not exist; pass a path to a Jinja template.")
            self.chat_template = path.read_text()

    def tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """Normalize one prompt to ``(text or None, token ids)``."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                return prompt.get("prompt"), self._check_ids(ids)
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs a 'prompt' (text) or 'prompt_token_ids' (list of ints) key.")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine was started with skip_tokenizer_init=True; pass "
                                 "{'prompt_token_ids': [...]} instead of text.")
            return prompt, list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, self._check_ids(prompt)
        raise ValueError(f"unsupported prompt type {type(prompt).__name__}: give a string, a list of token ids, "
                         "or a dict with 'prompt' or 'prompt_token_ids'.")

    def _check_ids(self, ids: Any) -> list[int]:
        if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt_token_ids must be a list of integers.")
        vocab = self.model_info.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the model's vocabulary [0, {vocab}).")
        return list(ids)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            continue_final_message: bool = False, chat_template: str | None = None,
                            tools: list | None = None, **template_kwargs) -> tuple[str, list[int]]:
        """Render a conversation with the model's template (or an override) and tokenize it."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this engine was started with skip_tokenizer_init=True.")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts.")
        template = chat_template or self.chat_template
        if template is None and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; pass chat_template= (or --chat-template FILE).")
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message, chat_template=template, tools=tools, **template_kwargs)
        ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        return text, ids

    def process(self, request_id: str, prompt: Any, params: SamplingParams, priority: int = 0,
                pooling: bool = False) -> tuple[str | None, list[int], list[EngineCoreRequest]]:
        text, ids = self.tokenize(prompt)
        self.validate(ids, params, pooling)
        arrival = time.time()
        extra_eos = [t for t in self.model_info.eos_token_ids[1:] if t not in params.stop_token_ids]
        if extra_eos and not params.ignore_eos and not pooling:
            # a model with several end-of-sequence ids stops at any of them, as vLLM does
            params = params.clone()
            params.stop_token_ids = list(params.stop_token_ids) + extra_eos
        reqs = []
        for i, sid in enumerate(seq_ids_for(request_id, params.n)):
            p = params
            if params.n > 1:
                p = params.clone()
                p.n = 1
                if params.seed is not None:
                    p.seed = child_seed(params.seed, i)
            reqs.append(EngineCoreRequest(sid, ids, p, arrival, priority, self.model_info.eos_token_id, pooling))
        return text, ids, reqs

    def validate(self, ids: list[int], params: SamplingParams, pooling: bool = False) -> None:
        if not ids:
            raise ValueError("the prompt is empty; give at least one token.")
        limit = self.model_info.max_model_len
        if len(ids) > limit or (len(ids) == limit and not pooling):
            raise ValueError(f"the prompt has {len(ids)} tokens but max_model_len is {limit} (including at least "
                             "one generated token); shorten the prompt or raise --max-model-len.")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > self.max_logprobs:
                raise ValueError(f"{name}={k} exceeds max_logprobs={self.max_logprobs}; ask for fewer or start "
                                 "the engine with a larger --max-logprobs.")
        vocab = self.model_info.vocab_size
        for name in ("stop_token_ids", "allowed_token_ids"):
            bad = [t for t in (getattr(params, name) or []) if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{name} {bad[:5]} are outside the vocabulary [0, {vocab}).")
        bad = [t for t in (params.logit_bias or {}) if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"logit_bias keys {bad[:5]} are outside the vocabulary [0, {vocab}).")
