"""Which decode steps may take the platform's LM head + sampler graphs, and the call (issue 17 item 2).

A platform's step runner may carry a ``head`` (CUDA: ``plugins/platforms/cuda_graph_head.py``) that replays the LM
head and the sampler after the body graph. The core decides when that gives exactly the eager tokens: only the
decisions here read sampling parameters; the platform only replays. A step that does not qualify runs the eager
head and sampler (``ModelRunner``), as without a head.
"""

from __future__ import annotations

import torch

from octavo.core.input_batch import build_sampling_batch


def head_mode(states, fused_ok: bool) -> str | None:
    """``"greedy"``, ``"random"`` or ``None`` (eager head) for the requests sampling this step (their
    :class:`~octavo.core.input_batch.CachedRequestState`, row order). ``fused_ok``: the eager sampler takes the
    fused kernel for a batch with random rows and no filters (``Sampler.uses_fused``), and the head has it."""
    random = filtered = False
    for r in states:
        p = r.sampling_params
        if (p.logprobs is not None or p.prompt_logprobs is not None or p.presence_penalty or p.frequency_penalty
                or p.repetition_penalty != 1.0 or p.logit_bias or p.allowed_token_ids or p.bad_words
                or r.num_output_tokens < p.min_tokens or getattr(r, "lora_request", None) is not None):
            return None
        random = random or p.temperature != 0
        filtered = filtered or p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0
    if not random:  # all greedy: the eager sampler takes the plain argmax whatever the filters say
        return "greedy"
    return "random" if fused_ok and not filtered else None  # filters: the eager path's thresholds (not captured)


def step_qualifies(runner, batch, inputs, grammar) -> bool:
    """Step-level conditions: one sampled row per scheduled request, in order, nothing else to compute."""
    if grammar is not None or runner.lora is not None or runner.spec_head is not None or inputs.spec_token_ids \
            or inputs.prompt_lp_rows or inputs.pooling_req_ids:
        return False
    if any(s.grammar_bitmask is not None for s in batch.scheduled):
        return False
    return [s.request_id for s in batch.scheduled] == inputs.sample_req_ids


def graph_head_sample(runner, batch, inputs, hidden: torch.Tensor, grammar) -> torch.Tensor | None:
    """The step's sampled ids ``[n]`` (device) from the head graphs of ``runner.graph_runner.head``, or None (the
    caller runs the eager head). ``runner``: the :class:`~octavo.core.model_runner.ModelRunner`."""
    head = runner.graph_runner.head
    if not head.ready(hidden) or not step_qualifies(runner, batch, inputs, grammar):
        return None
    states = [runner.requests[rid] for rid in inputs.sample_req_ids]
    sampler = runner.sampler
    fused_ok = sampler.kernel is not None and (sampler.force_fused or sampler.fused) and "random" in head.modes
    mode = head_mode(states, fused_ok)
    if mode is None:
        return None
    n = hidden.shape[0]
    if mode == "greedy":
        if head.agrees and runner.async_steps is not None:
            runner.async_steps.ranks_agree = True  # every rank reduced the same gathered pairs: no broadcast
        return head.sample("greedy", n)
    sampling = build_sampling_batch(states, runner.vocab_size, runner.device, runner.generators)
    return head.sample("random", n, sampling)
