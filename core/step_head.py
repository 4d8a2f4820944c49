"""Which decode steps may take the platform's LM head + sampler graphs, and the call (issue 17 item 2).

A platform's step runner may carry a ``head`` (CUDA: ``plugins/platforms/cuda_graph_head.py``) that replays the LM
head and the sampler after the body graph. The core decides when that gives exactly the eager tokens: only the
decisions here read sampling parameters; the platform only replays. A step that does not qualify runs the eager
head and sampler (``ModelRunner``), as without a head.
"""

from __future__ import annotations

import torch

from octavo.core.input_batch import build_sampling_batch
from octavo.core.sampler import filter_thresholds
from octavo.step import PLACEHOLDER


def head_mode(states, fused_ok: bool) -> str | None:
    """``"greedy"``, ``"random"`` (no row filters), ``"filtered"`` (some row has top-k / top-p / min-p) or ``None``
    (eager head) for the requests sampling this step (their :class:`~octavo.core.input_batch.CachedRequestState`,
    row order). ``fused_ok``: the platform has the fused sampler and the head its graphs; random modes are then
    still checked against the step's ``SamplingBatch`` (``Sampler.uses_fused``) by :func:`graph_head_sample`."""
    random = filtered = False
    for r in states:
        p = r.sampling_params
        if (p.logprobs is not None or p.prompt_logprobs is not None or p.presence_penalty or p.frequency_penalty
                or p.repetition_penalty != 1.0 or p.logit_bias or p.allowed_token_ids or p.bad_words
                or r.num_output_tokens < p.min_tokens or getattr(r, "lora_request", None) is not None):
            return None
        random = random or p.temperature != 0
        filtered = filtered or p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0
    if not random:  # all greedy: the eager sampler takes the plain argmax (SamplingParams drops greedy filters)
        return "greedy"
    if not fused_ok:  # the eager torch sampler draws other noise: no graph gives its tokens
        return None
    return "filtered" if filtered else "random"


def step_qualifies(runner, batch, inputs, grammar) -> bool:
    """Step-level conditions: one sampled row per scheduled request, in order, nothing else to compute."""
    if grammar is not None or runner.lora is not None or runner.spec_head is not None or inputs.spec_token_ids \
            or inputs.prompt_lp_rows or inputs.pooling_req_ids:
        return False
    if any(s.grammar_bitmask is not None for s in batch.scheduled):
        return False
    return [s.request_id for s in batch.scheduled] == inputs.sample_req_ids


def step_graph_source(runner, batch, grammar) -> tuple[int | None, torch.Tensor | None] | None:
    """Whether this step may run as the platform's one-graph batch-1 step (``runner.graph_runner.step_graph``: inputs +
    body + greedy head in one replay, CUDA: plugins/platforms/cuda_step_graph.py), and where its input id comes from:
    ``(host id, None)``; ``(None, None)``: a placeholder whose value is row 0 of the previous step's ids, held where the
    graph reads them (``step_graph.holds``); ``(None, ids)``: a placeholder whose value is the one-element device
    tensor ``ids`` (the previous step sampled elsewhere: copied there first); or None. Only one request decoding one
    token, greedy with nothing else to compute (:func:`head_mode`), no grammar, LoRA, speculator, images or M-RoPE.
    Called after ``update_states``, before ``AsyncRunnerSteps.prepare``."""
    sg = getattr(runner.graph_runner, "step_graph", None)
    if sg is None or not sg.active or grammar is not None or runner.lora is not None or runner.spec_head is not None \
            or runner.mrope_merge or len(batch.scheduled) != 1:
        return None
    s = batch.scheduled[0]
    if len(s.token_ids) != 1 or s.spec_token_ids or not s.samples or s.grammar_bitmask is not None \
            or s.num_computed_tokens + 1 > sg.max_model_len:
        return None
    state = runner.requests[s.request_id]
    if state.pooling or state.mm_inputs or head_mode([state], False) != "greedy":
        return None
    tok = s.token_ids[0]
    if tok != PLACEHOLDER:
        return tok, None
    steps = runner.async_steps
    row = None if steps is None or steps.prev_sampled is None else steps.prev_rows.get(s.request_id)
    if row is None:
        return None  # AsyncRunnerSteps.prepare raises for it
    prev = steps.prev_sampled
    return (None, None) if row == 0 and sg.holds(prev) else (None, prev[row:row + 1])


def graph_head_sample(runner, batch, inputs, hidden: torch.Tensor, grammar) -> torch.Tensor | None:
    """The step's sampled ids ``[n]`` (device) from the head graphs of ``runner.graph_runner.head``, or None (the
    caller runs the eager head). ``runner``: the :class:`~octavo.core.model_runner.ModelRunner`."""
    head = runner.graph_runner.head
    if not head.ready(hidden) or not step_qualifies(runner, batch, inputs, grammar):
        return None
    states = [runner.requests[rid] for rid in inputs.sample_req_ids]
    sampler = runner.sampler
    mode = head_mode(states, sampler.kernel is not None and "random" in head.modes)
    if mode is None:
        return None
    n = hidden.shape[0]
    if mode == "greedy":
        if head.agrees and runner.async_steps is not None:
            runner.async_steps.ranks_agree = True  # every rank reduced the same gathered pairs: no broadcast
        return head.sample("greedy", n)
    sampling = build_sampling_batch(states, runner.vocab_size, runner.device, runner.generators)
    if not sampler.uses_fused(None, sampling):  # the eager sampler would take the torch path (other draws)
        return None
    if mode == "random":
        return head.sample("random", n, sampling)
    return head.sample("filtered", n, sampling, filter_thresholds(head.logits(n), sampling))
