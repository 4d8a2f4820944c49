"""What the server does with request fields it does not declare: refuse the ones that would change the
output, warn once about the rest (vLLM's behaviour), and render what vLLM adds to responses.

Request bodies accept extra fields (clients send vendor fields). An extra field is one of:

    refused    a vLLM/OpenAI field that would change what is generated and octavo does not implement:
               400 naming it (``param``), unless it carries its no-op default value
    unknown    anything else (``store``, ``metadata``, ``service_tier``, typos): accepted, and a
               warning naming it is logged once per field name, as vLLM logs ignored fields

The table of every field and what happens to it is docs/compatibility.md; tests/unit/test_fields_honored.py
keeps the two in step.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from octavo.errors import APIError

logger = logging.getLogger("octavo.server")

# field -> (its no-op value(s), why it is refused). A request may send the no-op value (clients do).
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "length_penalty": ((1.0, 1, None), "it applies to beam search only: send use_beam_search: true"),
    "logits_processors": ((None, []), "custom logits processors are not supported"),
    "bad_words": ((None, []), "bad_words is not supported yet; use logit_bias with -100 on those tokens"),
    "prompt_embeds": ((None,), "prompt embeddings are not supported; send text or token ids"),
    "mm_processor_kwargs": ((None, {}), "this model takes text only"),
    "multi_modal_data": ((None, {}), "this model takes text only"),
    "kv_transfer_params": ((None, {}), "KV transfer (disaggregated prefill) is not built"),
    "vllm_xargs": ((None, {}), "extra sampling arguments for custom logits processors are not supported"),
    "return_tokens_as_token_ids": ((False, None), "not supported; use return_token_ids"),
    "guided_decoding_backend": ((None,), "the backend is chosen per server with --structured-outputs-backend"),
    "functions": ((None, []), "the legacy 'functions' field is not supported; use 'tools'"),
    "function_call": ((None,), "the legacy 'function_call' field is not supported; use 'tool_choice'"),
    "documents": ((None, []), "RAG documents for the chat template are not supported"),
    "mm_hash_overrides": ((None,), "this model takes text only"),
    "audio": ((None,), "audio output is not supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "response_prefix": ((None,), "not supported; use continue_final_message"),
    "top_a": ((None, 0, 0.0), "top_a sampling is not supported"),
    "typical_p": ((None, 1, 1.0), "typical_p sampling is not supported"),
    "tfs": ((None, 1, 1.0), "tail-free sampling is not supported"),
    "mirostat": ((None, 0), "mirostat sampling is not supported"),
    "dry_multiplier": ((None, 0, 0.0), "DRY sampling is not supported"),
    "xtc_probability": ((None, 0, 0.0), "XTC sampling is not supported"),
}
# Read by other modules although not declared on the model (structured outputs, tool calls): not "unknown".
_READ_ELSEWHERE = frozenset({"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                             "guided_whitespace_pattern", "structured_outputs", "parallel_tool_calls",
                             "use_beam_search"})  # use_beam_search (+ length_penalty): sdk/server/beam.py

_warned: set[str] = set()


def check_extra_fields(req: Any) -> None:
    """Refuse extra fields that would change the output; warn once per name about the others.

    Raises:
        APIError: 400 with ``param`` the field's name.
    """
    if "messages" in type(req).model_fields and getattr(req, "echo", False):
        raise APIError(400, "echo is not supported on chat completions; use /v1/completions with echo.",
                       param="echo")
    extras = dict(getattr(req, "model_extra", None) or {})
    if getattr(req, "user", None) is not None:
        extras.setdefault("user", req.user)  # OpenAI's end-user id: octavo keeps no per-user state; warned
    for name, value in extras.items():
        rule = REFUSED.get(name)
        if name == "length_penalty" and extras.get("use_beam_search"):
            continue  # read by sdk/server/beam.py
        if rule is not None:
            noop, why = rule
            if not any(value == v and type(value) is type(v) or value is v for v in noop):
                raise APIError(400, f"{name} is not supported: {why}.", param=name)
            continue
        if name in _READ_ELSEWHERE or name in _warned:
            continue
        _warned.add(name)
        logger.warning("The request field %r is not used by octavo and was ignored (this is logged once per field "
                       "name); see docs/compatibility.md.", name[:64])


def prompt_logprobs_json(prompt_logprobs: list | None) -> list | None:
    """vLLM's ``prompt_logprobs`` response field: per prompt token ``None`` (the first) or
    ``{token_id: {"logprob", "rank", "decoded_token"}}`` (JSON keys are strings)."""
    if prompt_logprobs is None:
        return None
    out: list[dict[str, Any] | None] = []
    for pos in prompt_logprobs:
        if pos is None:
            out.append(None)
            continue
        out.append({str(tid): {"logprob": _finite(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
                    for tid, lp in pos.items()})
    return out


def _finite(x: float) -> float:
    return max(x, -9999.0) if not math.isnan(x) else -9999.0


def continuous_usage(req: Any, num_prompt: int, num_gen: int) -> dict[str, Any]:
    """``stream_options.continuous_usage_stats``: the usage so far on every streamed chunk (else nothing)."""
    opts = req.stream_options
    if not (opts and opts.include_usage and opts.continuous_usage_stats):
        return {}
    return {"usage": {"prompt_tokens": num_prompt, "completion_tokens": num_gen,
                      "total_tokens": num_prompt + num_gen}}


def apply_generation_defaults(req: Any, defaults: dict[str, Any]) -> Any:
    """The model's ``generation_config.json`` sampling defaults for the fields this request left out
    (vLLM's ``--generation-config auto``); the request's own values always win."""
    for name, value in defaults.items():
        if name in type(req).model_fields and name not in req.model_fields_set:
            if name == "max_tokens" and getattr(req, "max_completion_tokens", None) is not None:
                continue
            setattr(req, name, value)
    return req
