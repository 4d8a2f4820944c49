"""Front-end side of inputs: prompts -> validated ``EngineCoreRequest``s.

Accepts what vLLM accepts — a string, ``{"prompt": str}``, ``{"prompt_token_ids": [...]}`` — applies chat
templates, checks every limit the engine would trip over (so errors are ``ValueError``s naming the
problem, raised before anything reaches the core), and fans a request with ``n > 1`` out into ``n``
sequences with distinct seeds.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from octavo.core.messages import EngineCoreRequest, ModelInfo
from octavo.errors import InputError
from octavo.sampling_params import SamplingParams

# Chat-template keyword arguments a request may not set: they are the renderer's own arguments.
RESERVED_TEMPLATE_KWARGS = frozenset({"conversation", "messages", "tokenize", "add_generation_prompt",
                                      "continue_final_message", "chat_template", "tools", "documents",
                                      "return_tensors", "return_dict", "return_assistant_tokens_mask",
                                      "padding", "truncation", "max_length", "tokenizer_kwargs"})


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
        if settings.model.chat_template:  # a file or an inline template (core/loader/tokenizer.py)
            from octavo.core.loader.tokenizer import read_chat_template

            self.chat_template = read_chat_template(settings.model.chat_template)
        # Size bound checked before tokenizing: no text longer than this can fit max_model_len tokens, so a
        # 10 MB prompt is refused at once instead of tokenized for seconds (see max_prompt_chars).
        self.max_prompt_chars = max_prompt_chars(tokenizer, model_info.max_model_len)

    def tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """Normalize one prompt to ``(text or None, token ids)``."""
        if isinstance(prompt, dict):
            unknown = sorted(set(prompt) - _PROMPT_KEYS)
            if unknown:  # multi_modal_data, mm_processor_kwargs, ...: refused, never dropped
                raise InputError(f"prompt keys {unknown} are not supported (accepted: {sorted(_PROMPT_KEYS)}); "
                                 "give text or token ids.", unknown[0])
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                return prompt.get("prompt"), self._check_ids(ids)
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise InputError("a prompt dict needs a 'prompt' (text) or 'prompt_token_ids' (list of ints) key.",
                                 "prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("this engine was started with skip_tokenizer_init=True; pass "
                                 "{'prompt_token_ids': [...]} instead of text.", "prompt")
            return prompt, self.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, self._check_ids(prompt)
        raise InputError(f"unsupported prompt type {type(prompt).__name__}: give a string, a list of token ids, "
                         "or a dict with 'prompt' or 'prompt_token_ids'.", "prompt")

    def encode(self, text: str, *, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
        """Tokenize ``text`` after the size bound (a text too long for max_model_len is refused untokenized)."""
        if len(text) > self.max_prompt_chars:
            raise InputError(f"the {param} has {len(text)} characters, more than {self.max_model_len_tokens} tokens "
                             f"(max_model_len) can hold; shorten it.", param)
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)

    @property
    def max_model_len_tokens(self) -> int:
        return self.model_info.max_model_len

    def _check_ids(self, ids: Any) -> list[int]:
        # the type and range checks run at C speed for plain int lists (256 nano-vllm prompts, 144k ids: 12 -> 7 ms
        # on a 2-vCPU EPYC, all of it before the run's first step); anything else takes the per-item path
        if not isinstance(ids, (list, tuple)) or not (set(map(type, ids)) <= {int} or all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise InputError("prompt_token_ids must be a list of integers.", "prompt")
        vocab = self.model_info.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab] if ids and (min(ids) < 0 or max(ids) >= vocab) else None
        if bad:
            raise InputError(f"token ids {bad[:5]} are outside the model's vocabulary [0, {vocab}).", "prompt")
        return list(ids)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            continue_final_message: bool = False, chat_template: str | None = None,
                            tools: list | None = None, template_kwargs: dict | None = None) -> tuple[str, list[int]]:
        """Render a conversation with the model's template (or an override) and tokenize it.

        Raises:
            InputError: bad messages, a reserved keyword in ``template_kwargs`` or a template that fails to
                render (syntax error, ``{% include %}``, ``raise_exception``, a missing key): never a crash.
        """
        if self.tokenizer is None:
            raise InputError("chat needs a tokenizer; this engine was started with skip_tokenizer_init=True.",
                             "messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise InputError("messages must be a list of {'role': ..., 'content': ...} dicts.", "messages")
        template_kwargs = dict(template_kwargs or {})
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs))
        if reserved:
            raise InputError(f"chat_template_kwargs may not set {reserved}: they are arguments of the renderer "
                             "itself (use the request's own fields).", "chat_template_kwargs")
        template = chat_template or self.chat_template
        if template is None and not getattr(self.tokenizer, "chat_template", None):
            raise InputError("this model has no chat template; pass chat_template= (or --chat-template FILE).",
                             "messages")
        # A missing or null content renders as "" (a template that reads it must not crash); a turn with
        # tool_calls keeps its null, which tool-calling templates test for.
        messages = [m if isinstance(m.get("content"), str) or "tool_calls" in m
                    else {**m, "content": m.get("content") or ""} for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message, chat_template=template, tools=tools,
                **template_kwargs)
        except (MemoryError, RecursionError) as e:
            raise InputError(f"the chat template could not be rendered: {type(e).__name__}.",
                             "chat_template" if chat_template else "messages") from None
        except Exception as e:  # noqa: BLE001 - Jinja errors, template raise_exception, bad message shapes
            where = "chat_template" if chat_template else "messages"
            raise InputError(f"the chat template could not render these messages: {_first_line(e)}", where) from None
        if not isinstance(text, str):
            raise InputError("the chat template did not render to text.", "chat_template")
        return text, self.encode(text, add_special_tokens=False, param="messages")

    def process(self, request_id: str, prompt: Any, params: SamplingParams, priority: int = 0,
                pooling: bool = False) -> tuple[str | None, list[int], list[EngineCoreRequest]]:
        text, ids = self.tokenize(prompt)
        ids, salt = _truncate(ids, params, self.model_info.max_model_len), _cache_salt(prompt)
        self.validate(ids, params, pooling)
        if not -(2**63) <= priority < 2**63:
            raise InputError(f"priority={priority} does not fit in 64 bits.", "priority")
        if priority != 0 and self.settings.scheduler.scheduling_policy != "priority":
            raise InputError(f"priority={priority} needs scheduling_policy='priority' (--scheduling-policy "
                             "priority); this engine runs fcfs.", "priority")
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
            reqs.append(EngineCoreRequest(sid, ids, p, arrival, priority, self.model_info.eos_token_id, pooling, salt))
        return text, ids, reqs

    def validate(self, ids: list[int], params: SamplingParams, pooling: bool = False) -> None:
        if not ids:
            raise InputError("the prompt is empty; give at least one token.", "prompt")
        limit = self.model_info.max_model_len
        if len(ids) > limit or (len(ids) == limit and not pooling):
            raise InputError(f"the prompt has {len(ids)} tokens but max_model_len is {limit} (including at least "
                             "one generated token); shorten the prompt or raise --max-model-len.", "prompt")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > self.max_logprobs:
                raise InputError(f"{name}={k} exceeds max_logprobs={self.max_logprobs}; ask for fewer or start "
                                 "the engine with a larger --max-logprobs.", name)
        # what crosses to the core as msgpack must fit 64 bits (a bigger int cannot even be encoded)
        if params.seed is not None and not -(2**63) <= params.seed < 2**64:
            raise InputError(f"seed={params.seed} does not fit in 64 bits.", "seed")
        for name in ("max_tokens", "min_tokens", "top_k"):
            value = getattr(params, name, None)
            if isinstance(value, int) and not -(2**31) <= value < 2**31:
                raise InputError(f"{name}={value} is out of range (32-bit).", name)
        vocab = self.model_info.vocab_size
        for name in ("stop_token_ids", "allowed_token_ids"):
            bad = [t for t in (getattr(params, name) or []) if not 0 <= t < vocab]
            if bad:
                raise InputError(f"{name} {bad[:5]} are outside the vocabulary [0, {vocab}).", name)
        bad = [t for t in (params.logit_bias or {}) if not 0 <= t < vocab]
        if bad:
            raise InputError(f"logit_bias keys {bad[:5]} are outside the vocabulary [0, {vocab}).", "logit_bias")


_PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "cache_salt"})


def _truncate(ids: list[int], params: SamplingParams, max_model_len: int) -> list[int]:
    """``truncate_prompt_tokens``: keep the last k prompt tokens (-1: as many as max_model_len leaves room for)."""
    k = params.truncate_prompt_tokens
    if k is None:
        return ids
    k = max_model_len - 1 if k == -1 else k
    return ids[-k:] if len(ids) > k else ids


def _cache_salt(prompt: Any) -> str | None:
    """A prompt's ``cache_salt``: an extra key of its prefix-cache hashes, so only equal salts share blocks."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt or len(salt) > 1024):
        raise InputError("cache_salt must be a non-empty string of at most 1024 characters.", "cache_salt")
    return salt


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def max_prompt_chars(tokenizer: Any, max_model_len: int) -> int:
    """Characters beyond which a text cannot fit ``max_model_len`` tokens (an upper bound, with slack).

    Every token covers at most ``L`` characters, ``L`` the longest token string in the vocabulary (a
    byte-level token's string has one character per byte, so it bounds the decoded text too); a text of
    more than ``L * max_model_len`` characters therefore has more than ``max_model_len`` tokens. Twice
    that is refused before tokenizing (normalizers may shorten text a little).
    """
    if tokenizer is None:
        return 1 << 62
    try:
        longest = max(len(t) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) if t)
    except Exception:  # noqa: BLE001 - an exotic tokenizer: fall back to a generous constant
        longest = 64
    return 2 * max(longest, 16) * max_model_len + 1024
