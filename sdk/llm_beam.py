"""The two drivers of beam search (``octavo.beam_search``): ``LLM.beam_search`` steps the offline engine,
``AsyncLLM.beam_search`` awaits the async one (the server's ``use_beam_search``).

Each round sends one 1-token request per live beam (``logprobs`` = the candidates the search needs) and
feeds their log-probabilities to :class:`BeamSearch`. Prefix caching keeps the shared prompt and the
beams' common history in the KV cache, so a round recomputes at most the last partial block of each beam.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from octavo.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from octavo.sampling_params import RequestOutputKind, SamplingParams

_PASSED_KEYS = ("cache_salt",)  # prompt-dict keys each round's requests carry on


def _eos_ids(model_info: Any) -> list[int]:
    ids = list(getattr(model_info, "eos_token_ids", None) or [])
    if not ids and getattr(model_info, "eos_token_id", None) is not None:
        ids = [model_info.eos_token_id]
    return ids


def step_sampling_params(params: BeamSearchParams, num_candidates: int, detokenize: bool = False) -> Any:
    """The ``SamplingParams`` of one beam's one-token request (vLLM's: ``logprobs`` = candidates wanted;
    ``detokenize`` fills each candidate's ``decoded_token``, which the server's logprobs need)."""
    return SamplingParams(max_tokens=1, logprobs=num_candidates, temperature=params.temperature,
                          detokenize=detokenize, output_kind=RequestOutputKind.FINAL_ONLY)


def new_search(frontend: Any, prompt: Any, params: BeamSearchParams) -> tuple[BeamSearch, dict]:
    """Tokenize one prompt and start its search; returns it and the prompt-dict keys every round carries.

    Raises:
        ValueError: images (not supported with beam search), or the prompt plus ``max_tokens`` exceed
            ``max_model_len``.
    """
    if not isinstance(params, BeamSearchParams):
        raise TypeError(f"beam_search takes a BeamSearchParams, got {type(params).__name__}.")
    extra = {}
    if isinstance(prompt, dict):
        if prompt.get("multi_modal_data"):
            raise ValueError("multi_modal_data is not supported with beam search.")
        extra = {k: prompt[k] for k in _PASSED_KEYS if k in prompt}
    _, ids = frontend.tokenize(prompt)
    limit = frontend.model_info.max_model_len
    if len(ids) + params.max_tokens > limit:
        raise ValueError(f"max_tokens: the prompt ({len(ids)} tokens) plus max_tokens={params.max_tokens} exceed "
                         f"max_model_len={limit}.")
    return BeamSearch(ids, params, _eos_ids(frontend.model_info)), extra


def beam_search(llm: Any, prompts: Any, params: BeamSearchParams, lora_request: Any = None,
                use_tqdm: bool = False, concurrency_limit: int | None = None,
                num_logprobs: int = 0) -> list[BeamSearchOutput]:
    """``LLM.beam_search`` (vLLM's signature): one :class:`BeamSearchOutput` per prompt, in order.

    Args:
        prompts: strings, token-id lists or prompt dicts (``TextPrompt``/``TokensPrompt``).
        params: the :class:`BeamSearchParams`.
        lora_request: one ``LoRARequest`` for all prompts, or one per prompt.
        use_tqdm: a progress bar over the rounds.
        concurrency_limit: most prompts searched at the same time (default: all).
    """
    from octavo.prompt_batch import _as_list, _per_prompt_lora

    prompts = _as_list(prompts)
    loras = _per_prompt_lora(lora_request, len(prompts)) or [None] * len(prompts)
    if concurrency_limit is not None and concurrency_limit < 1:
        raise ValueError(f"concurrency_limit must be >= 1, got {concurrency_limit}.")
    frontend = llm.llm_engine.frontend
    started = [new_search(frontend, p, params) for p in prompts]
    searches = [s for s, _ in started]
    sp = step_sampling_params(params, max(num_logprobs, searches[0].beams_to_keep if searches else 0),
                              detokenize=num_logprobs > 0)
    limit = concurrency_limit or max(1, len(prompts))
    bar = None
    if use_tqdm:
        from tqdm.auto import tqdm

        bar = tqdm(total=params.max_tokens * len(prompts), desc="Beam search", dynamic_ncols=True)
    try:
        for first in range(0, len(prompts), limit):
            group = list(range(first, min(first + limit, len(prompts))))
            while True:
                active = [i for i in group if not searches[i].done]
                if not active:
                    break
                batch, owners, batch_loras = [], [], []
                for i in active:
                    for seq in searches[i].live():
                        batch.append({"prompt_token_ids": seq, **started[i][1]})
                        owners.append(i)
                        batch_loras.append(loras[i])
                outs = llm.generate(batch, sp, use_tqdm=False,
                                    lora_request=batch_loras if any(x is not None for x in batch_loras) else None)
                for i in active:
                    searches[i].advance([o.outputs[0].logprobs[0] for o, owner in zip(outs, owners) if owner == i])
                if bar is not None:
                    bar.update(len(active))
    finally:
        if bar is not None:
            bar.close()
    tokenizer = llm.get_tokenizer()
    return [s.output(tokenizer, lora) for s, lora in zip(searches, loras)]


async def run_search_async(engine: Any, search: BeamSearch, extra: dict, request_id: str, lora_request: Any = None,
                           priority: int = 0, num_logprobs: int | None = None) -> BeamSearchOutput:
    """Run a search started by :func:`new_search` over an ``AsyncLLM``: each round's beams run concurrently.

    ``num_logprobs`` (not None) makes every candidate carry its ``decoded_token`` and at least that many
    top entries (the server's ``logprobs``). A cancelled caller (client gone) cancels the round's requests,
    which aborts them in the core.
    """
    sp = step_sampling_params(search.params, max(num_logprobs or 0, search.beams_to_keep),
                              detokenize=num_logprobs is not None)
    rounds = 0

    async def one(j: int, seq: list[int]) -> dict:
        final = None
        async for out in engine.generate({"prompt_token_ids": seq, **extra}, sp, f"{request_id}-b{rounds}.{j}",
                                         priority, lora_request=lora_request):
            final = out
        return final.outputs[0].logprobs[0]

    while not search.done:
        search.advance(list(await asyncio.gather(*(one(j, s) for j, s in enumerate(search.live())))))
        rounds += 1
    return search.output(engine.get_tokenizer(), lora_request)


def to_request_output(result: BeamSearchOutput, request_id: str, prompt_text: str | None, tokenizer: Any,
                      include_stop_str_in_output: bool = False, skip_special_tokens: bool = True,
                      with_logprobs: bool = False) -> Any:
    """A finished ``RequestOutput`` whose ``outputs`` are the beams, best first (what vLLM's async engine and
    server return): ``text`` and ``token_ids`` are the generated part; the EOS text only with
    ``include_stop_str_in_output``."""
    from octavo.outputs import CompletionOutput, RequestOutput

    outs = []
    for i, seq in enumerate(result.sequences):
        gen = seq.tokens[seq.num_prompt_tokens:]
        shown = gen[:-1] if seq.finish_reason == "stop" and not include_stop_str_in_output else gen
        text = tokenizer.decode(shown, skip_special_tokens=skip_special_tokens) if tokenizer is not None else ""
        outs.append(CompletionOutput(index=i, text=text, token_ids=gen, cumulative_logprob=seq.cum_logprob,
                                     logprobs=seq.logprobs if with_logprobs else None,
                                     finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
    prompt_ids = result.sequences[0].tokens[:result.sequences[0].num_prompt_tokens] if result.sequences else []
    return RequestOutput(request_id=request_id, prompt=prompt_text, prompt_token_ids=prompt_ids, prompt_logprobs=None,
                         outputs=outs, finished=True)


async def beam_search_async(engine: Any, prompt: Any, params: BeamSearchParams, request_id: str,
                            lora_request: Any = None) -> AsyncIterator[Any]:
    """``AsyncLLM.beam_search`` (vLLM's ``EngineClient.beam_search``): yields one finished ``RequestOutput``
    whose ``outputs`` are the ``beam_width`` beams, best first."""
    search, extra = new_search(engine.frontend, prompt, params)
    result = await run_search_async(engine, search, extra, request_id, lora_request)
    text = prompt if isinstance(prompt, str) else (prompt.get("prompt") if isinstance(prompt, dict) else None)
    yield to_request_output(result, request_id, text, engine.get_tokenizer(), params.include_stop_str_in_output)
