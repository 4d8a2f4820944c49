"""The model runner: one step's inputs -> model -> logits -> sampled tokens (and logprobs, pooled vectors).

It speaks the step contract (``octavo.core.step``) only: a :class:`StepBatch` in, a :class:`RunnerOutput` out,
and its own per-request state (``self.requests``) in between, dropped on ``finished_ids``. Everything
crosses to the host once per step, at the end (``_to_host``), after all device work is queued.
"""

from __future__ import annotations

import torch

from octavo.core import grammar_chain
from octavo.core.grammar_step import mask_logits
from octavo.core.input_batch import CachedRequestState, StepInputs, build_sampling_batch, build_step_inputs
from octavo.core.messages import TokenLogprobs
from octavo.core.multimodal_rope import step_rope_positions
from octavo.core.multimodal_runner import EncoderCache, build_mm_embeds
from octavo.core.sampler import Sampler, compute_logprobs, gather_logprobs
from octavo.core.spec_verify import fill_runner_output, first_logits_rows, verify_on_device
from octavo.core.step_head import graph_head_sample, step_graph_source
from octavo.model import ForwardContext
from octavo.step import PromptLogprobs, RunnerOutput, StepBatch


class ModelRunner:
    def __init__(self, model: torch.nn.Module, attn_backend_cls, device: torch.device, block_size: int,
                 vocab_size: int, synchronize=lambda: None, task: str = "auto", grammar_apply=None,
                 fused_sampler=None, greedy_argmax=None) -> None:
        self.model = model
        self.attn_backend_cls = attn_backend_cls
        self.device = device
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.sampler = Sampler(fused_sampler)  # the platform's fused sampler (Platform.make_fused_sampler) or None
        self.sampler.greedy_argmax = greedy_argmax  # Platform.make_greedy_argmax, or None (torch.argmax)
        self.synchronize = synchronize  # the platform's: waits for queued device work
        self.grammar_apply = grammar_apply  # the platform's grammar mask apply (Platform.make_grammar_mask_apply)
        self.generators: dict[str, torch.Generator] = {}
        self.requests: dict[str, CachedRequestState] = {}  # persistent across steps
        self.is_pooling = task in ("embed", "classify", "score", "reward") or (  # docs/pooling.md
            task == "auto" and hasattr(model, "pool") and not hasattr(model, "compute_logits"))
        if self.is_pooling and not hasattr(model, "pool"):
            raise ValueError(f"{type(model).__name__} cannot produce embeddings (it has no pooler); use a model "
                             "whose architecture supports task='embed'.")
        # A graph runner (e.g. CUDA graphs) may replace ``forward_fn`` for decode batches; see ``forward``.
        self.graph_runner = None
        self.lora = None  # octavo.lora.manager.LoRAManager when enable_lora (set by the worker)
        self.spec_head = None  # core/spec_decode_heads.HeadRunner for head speculators (set by the worker)
        self.async_steps = None  # core/async_runner.AsyncRunnerSteps under async scheduling (set by the worker)
        self.encoder_cache = EncoderCache()  # image hash -> embeddings (core/multimodal_runner.py)
        self.mrope_merge = getattr(model, "mrope_spatial_merge_size", None)  # M-RoPE models (Qwen2-VL)

    def update_states(self, batch: StepBatch) -> None:
        """Forget finished requests first (an id may come back as a new request in the same batch), then
        add new ones and write this step's tokens into each scheduled request's sequence."""
        for rid in batch.finished_ids:
            self.requests.pop(rid, None)
            self.generators.pop(rid, None)
        for new in batch.new_requests:
            self.requests[new.request_id] = CachedRequestState(new)
        for s in batch.scheduled:
            state = self.requests.get(s.request_id)
            if state is None:
                raise RuntimeError(f"request {s.request_id} is scheduled but was never described to the runner "
                                   "(missing from new_requests)")
            state.write(s)

    def forward(self, inputs: StepInputs, mm_embeds=None) -> torch.Tensor:
        # a captured decode step brings its own static metadata; LoRA steps too once the graphs hold the LoRA ops
        if self.graph_runner is not None and (self.lora is None or self.lora.graph_ok) and mm_embeds is None:
            hidden = self.graph_runner.maybe_run(inputs)
            if hidden is not None:
                return hidden
        # models without paged attention (encoders attending within each request) need no metadata
        metadata = self.attn_backend_cls.build_metadata(inputs.layout, self.device) if self.attn_backend_cls else None
        ctx = ForwardContext(attn_metadata=metadata, query_start_loc=inputs.query_start_loc)
        if mm_embeds is not None:  # image embeddings replacing their placeholder tokens
            ctx.extra["mm_embeds"] = mm_embeds
        return self.model(inputs.input_ids, inputs.positions, ctx)

    @torch.inference_mode()
    def execute(self, batch: StepBatch, grammar=None) -> RunnerOutput:
        self.update_states(batch)
        if self.async_steps is not None:  # (the last step's host ids: this step's chained grammar fill, queued first)
            prev_copy, self.async_steps.last_copy = self.async_steps.last_copy, None
            if grammar is not None:
                grammar_chain.launch(grammar, prev_copy, self.grammar_apply)
        spec_step = self.spec_head.begin(batch) if self.spec_head is not None else None  # core/spec_decode_heads.py
        result = RunnerOutput(sampled={}, logprobs={}, prompt_logprobs={}, pooled={})
        if batch.is_empty:
            return result
        reqs = self.requests
        one = step_graph_source(self, batch, grammar)  # batch-1 greedy decode as one graph (core/step_head.py)
        inputs = build_step_inputs(batch, reqs, self.block_size, self.device, copies=one is None)
        if self.async_steps is not None:  # placeholders <- the previous step's sampled ids, on the device
            self.async_steps.prepare(batch, inputs, reqs, fill=one is None)
        if one is not None:  # the graph stages its inputs, reads a placeholder's id itself, samples greedily
            hidden, sampled, on_host = self.graph_runner.step_graph.run(inputs.layout, *one)
            return self._finish(result, {"sampled": sampled}, inputs, reqs, hidden, spec_step,
                                None if on_host is None else {"sampled": on_host})
        if self.mrope_merge:  # rope positions from each request's image grids (core/multimodal_rope.py)
            inputs.positions = step_rope_positions(batch, reqs, inputs, self.mrope_merge, self.device)
        if self.lora is not None:  # each token's adapter slot for this step (octavo.lora.manager)
            ids = [s.request_id for s in batch.scheduled]  # a request whose adapter fails to load fails alone
            result.failed = self.lora.prepare(ids, [reqs[rid].lora_request for rid in ids],
                                              [len(s.token_ids) + len(s.spec_token_ids) for s in batch.scheduled])
        mm_embeds = None
        if any(reqs[s.request_id].mm_inputs for s in batch.scheduled):
            enc = self.encoder_cache
            encoded, hits = enc.encoded, enc.hits
            mm_embeds = build_mm_embeds(self.model, enc, batch, reqs, self.device)
            result.mm_items_encoded, result.mm_encoder_cache_hits = enc.encoded - encoded, enc.hits - hits
        hidden = self.forward(inputs, mm_embeds)

        if inputs.pooling_req_ids:
            ctx = ForwardContext(attn_metadata=None, query_start_loc=inputs.query_start_loc)
            pooled = self.model.pool(hidden, ctx)  # [num_reqs, dim], one row per scheduled request
            order = [s.request_id for s in batch.scheduled]
            pooled_host = pooled.float().cpu()
            for rid in inputs.pooling_req_ids:
                result.pooled[rid] = pooled_host[order.index(rid)].tolist()
        if not inputs.sample_req_ids and not inputs.prompt_lp_rows:
            if spec_step is not None:  # a stateful head (EAGLE) reads every step's hidden states
                self.spec_head.after_step(spec_step, hidden, inputs, {}, reqs, self.device)
            return result

        if self.graph_runner is not None and getattr(self.graph_runner, "head", None) is not None:
            sampled = graph_head_sample(self, batch, inputs, hidden, grammar)  # LM head + sampler replayed
            if sampled is not None:
                return self._finish(result, {"sampled": sampled}, inputs, reqs, hidden, spec_step)
        # Device work first: sampling and (prompt) logprobs; then one transfer to the host.
        rows = hidden if inputs.logits_all_rows and hidden.shape[0] == inputs.logits_indices.shape[0] else \
            hidden[inputs.logits_indices]  # (every row in order: no gather kernel; input_batch.CONST_INPUTS)
        logits = self.model.compute_logits(rows) if inputs.sample_req_ids else None
        sampling = None  # the sampler's per-row tensors, built before a parked sampling waits for its mask
        if logits is not None and not inputs.spec_token_ids:
            sample_reqs = [reqs[rid] for rid in inputs.sample_req_ids]
            sampling = build_sampling_batch(sample_reqs, self.vocab_size, self.device, self.generators)
            if self.async_steps is not None:
                self.async_steps.complete_penalties(sampling, sample_reqs)
        if self.async_steps is not None and hasattr(grammar, "park"):  # async, in-process: the rest of the step
            return grammar.park(  # runs when the grammar gate opens, on that thread (core/async_engine.py)
                lambda: self._sample(batch, grammar, inputs, reqs, hidden, logits, sampling, result, spec_step),
                self.device)
        return self._sample(batch, grammar, inputs, reqs, hidden, logits, sampling, result, spec_step)

    @torch.inference_mode()
    def _sample(self, batch, grammar, inputs, reqs, hidden, logits, sampling, result, spec_step) -> RunnerOutput:
        """:meth:`execute` from the logits on: grammar mask, sampler, prompt logprobs, the host copies."""
        pending = {}
        if inputs.sample_req_ids:
            if grammar is not None or any(s.grammar_bitmask is not None for s in batch.scheduled):
                # structured outputs: the engine core's token bitmasks (filled while the forward ran)
                logits = mask_logits(logits, batch, inputs.sample_req_ids,
                                     lambda rows: first_logits_rows(inputs.spec_token_ids, rows), grammar,
                                     self.grammar_apply)
            if inputs.spec_token_ids:  # drafts to verify: k + 1 logits rows per request (core/spec_decode.py)
                sample_reqs = [reqs[rid] for rid in inputs.sample_req_ids]
                pending.update(verify_on_device(logits, sample_reqs, inputs.spec_token_ids, self.vocab_size,
                                                self.device, self.generators))
            else:
                so = self.sampler(logits, sampling)
                pending["sampled"] = so.sampled
                if so.logprobs is not None:
                    pending["lp_ids"], pending["lp"], pending["ranks"] = (so.logprob_token_ids, so.logprobs,
                                                                          so.sampled_ranks)
        for rid, (rows, targets, _) in inputs.prompt_lp_rows.items():
            k = reqs[rid].sampling_params.prompt_logprobs
            lp = compute_logprobs(self.model.compute_logits(hidden[rows.to(self.device)]))
            pending[("plp", rid)] = gather_logprobs(lp, targets.to(self.device), k)
        return self._finish(result, pending, inputs, reqs, hidden, spec_step)

    def _finish(self, result, pending, inputs, reqs, hidden, spec_step, on_host=None) -> RunnerOutput:
        """The step's device results (``pending``) to the host, now or (async scheduling) a step later. ``on_host``:
        results the device writes into host memory itself (the zero-copy step graph), valid once its work is done."""
        if self.async_steps is not None:  # async scheduling: the host reads these tokens later (core/async_runner.py)
            if on_host is None:  # (the TP subclass, core/tp_comm.py, takes no on_host: the step graph is TP=1 only)
                return self.async_steps.defer(result, pending, inputs, reqs)
            return self.async_steps.defer(result, pending, inputs, reqs, on_host)
        if on_host is not None:
            self.synchronize()
            host = {**_to_host({k: v for k, v in pending.items() if k not in on_host}, lambda: None), **on_host}
        else:
            host = _to_host(pending, self.synchronize)
        fill_result(result, host, inputs, reqs)
        if spec_step is not None:  # a head speculator drafts from this step's hidden states
            result.spec_token_ids = self.spec_head.after_step(spec_step, hidden, inputs, result.sampled, reqs,
                                                              self.device)
        return result


def fill_result(result: RunnerOutput, host: dict, inputs: StepInputs, reqs: dict) -> None:
    """Sampled tokens, logprobs and prompt logprobs from the host copies into ``result`` (``reqs`` is read
    for each request's sampling parameters only, so a deferred step may pass a snapshot)."""
    if "row_tokens" in host:
        fill_runner_output(result, host, inputs.sample_req_ids, inputs.spec_token_ids, reqs, _row_logprobs)
    if "sampled" in host:
        tokens = host["sampled"].tolist()
        for i, rid in enumerate(inputs.sample_req_ids):
            result.sampled[rid] = [tokens[i]]
            want = reqs[rid].sampling_params.logprobs
            if want is not None:
                result.logprobs[rid] = [_row_logprobs(host["lp_ids"][i], host["lp"][i], int(host["ranks"][i]),
                                                      want)]
    for rid, (_, _, first_pos) in inputs.prompt_lp_rows.items():
        ids, lps, ranks = host[("plp", rid)]
        k = reqs[rid].sampling_params.prompt_logprobs
        entries = [_row_logprobs(ids[j], lps[j], int(ranks[j]), k) for j in range(ids.shape[0])]
        result.prompt_logprobs[rid] = PromptLogprobs(first_pos, entries)


def _row_logprobs(ids: torch.Tensor, lps: torch.Tensor, rank: int, k: int) -> TokenLogprobs:
    """Chosen token first (with its rank), then the top ``k`` (ranks 1..k); duplicates of the chosen
    token among the top-k are kept, as vLLM does, so ``k`` entries always follow."""
    ids_l, lps_l = ids[: k + 1].tolist(), lps[: k + 1].tolist()
    return TokenLogprobs(ids_l, lps_l, [rank, *range(1, len(ids_l))])


def _to_host(pending: dict, synchronize) -> dict:
    """Copy every pending device tensor to the host with one synchronization (non-blocking copies, then
    one wait)."""
    def copy(x):
        if isinstance(x, tuple):
            return tuple(copy(t) for t in x)
        return x.to("cpu", non_blocking=True)

    host = {k: copy(v) for k, v in pending.items()}
    synchronize()
    return host
