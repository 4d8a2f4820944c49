"""``use_beam_search`` on ``/v1/completions`` and ``/v1/chat/completions`` (vLLM's extra field): the request
runs as a beam search (``octavo.llm_beam``) with ``beam_width = n`` and ``length_penalty``, and answers
with the ``n`` beams as its choices, best first (streamed as one final chunk per choice, as vLLM does).

Sampling fields that beam search does not use (top_p, penalties, stop strings, seed, ...) are refused with
a 400 naming them when they are not their defaults, instead of being dropped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from octavo.errors import APIError

# SamplingParams fields a beam-search request may set: they map onto BeamSearchParams or the rendering.
_USED = frozenset({"n", "best_of", "temperature", "max_tokens", "ignore_eos", "include_stop_str_in_output",
                   "logprobs", "output_kind", "skip_special_tokens", "spaces_between_special_tokens",
                   "detokenize"})


def wants_beam_search(req: Any) -> bool:
    return bool((getattr(req, "model_extra", None) or {}).get("use_beam_search"))


def _beam_params(req: Any, params: Any, prompt_len: int, max_model_len: int) -> Any:
    from octavo.beam_search import BeamSearchParams
    from octavo.sampling_params import SamplingParams

    default = SamplingParams()
    for name in params.__struct_fields__:
        if name not in _USED and getattr(params, name) != getattr(default, name):
            raise APIError(400, f"{name} is not supported with use_beam_search (beam search ranks beams by "
                           "log-probability only).", param=name)
    if params.best_of not in (None, params.n):
        raise APIError(400, "best_of must equal n with use_beam_search.", param="best_of")
    length_penalty = req.model_extra.get("length_penalty", 1.0)
    if length_penalty is None:
        length_penalty = 1.0
    if not isinstance(length_penalty, (int, float)) or isinstance(length_penalty, bool):
        raise APIError(400, "length_penalty must be a number.", param="length_penalty")
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - prompt_len
    try:
        return BeamSearchParams(beam_width=params.n, max_tokens=max_tokens, ignore_eos=params.ignore_eos,
                                temperature=params.temperature, length_penalty=float(length_penalty),
                                include_stop_str_in_output=params.include_stop_str_in_output)
    except ValueError as e:
        raise APIError(400, str(e), param="length_penalty" if "length_penalty" in str(e) else "n") from None


def beam_generators(serving: Any, req: Any, params: Any, prompts: list[tuple[dict, str]]) -> list:
    """One async iterator per prompt yielding its finished beams as a ``RequestOutput``. Prompts are
    tokenized and checked now, so bad input is a 400 before anything is sent."""
    from octavo.llm_beam import new_search, run_search_async, to_request_output

    engine = serving.engine
    lora = serving.loras.get(req.model)
    cache_salt = getattr(req, "cache_salt", None)
    gens = []
    for prompt, rid in prompts:
        ids = prompt.get("prompt_token_ids") or []
        bp = _beam_params(req, params, len(ids), engine.get_model_info().max_model_len)
        if cache_salt is not None:
            prompt = {**prompt, "cache_salt": cache_salt}
        search, extra = new_search(engine.frontend, {k: v for k, v in prompt.items() if k != "prompt"}, bp)

        async def run(search=search, extra=extra, rid=rid, text=prompt.get("prompt"), bp=bp) -> AsyncIterator[Any]:
            result = await run_search_async(engine, search, extra, rid, lora, req.priority,
                                            num_logprobs=params.logprobs)
            yield to_request_output(result, rid, text, engine.get_tokenizer(), bp.include_stop_str_in_output,
                                    params.skip_special_tokens, with_logprobs=params.logprobs is not None)

        gens.append(run())
    return gens
