"""The model runner: one step's inputs -> model -> logits -> sampled tokens (and logprobs, pooled vectors).

Everything crosses to the host once per step, at the end (``_to_host``), after all device work is queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.core.input_batch import StepInputs, build_sampling_batch, build_step_inputs
from octavo.core.messages import TokenLogprobs
from octavo.core.sampler import Sampler, compute_logprobs, gather_logprobs
from octavo.core.scheduler import SchedulerOutput
from octavo.model import ForwardContext


@dataclass
class ModelRunnerOutput:
    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # request id -> (first prompt position these cover, one entry per position)
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] = field(default_factory=dict)
    pooled: dict[str, list[float]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, attn_backend_cls, device: torch.device, block_size: int,
                 vocab_size: int, synchronize=lambda: None, task: str = "auto") -> None:
        self.model = model
        self.attn_backend_cls = attn_backend_cls
        self.device = device
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.sampler = Sampler()
        self.synchronize = synchronize  # the platform's: waits for queued device work
        self.generators: dict[str, torch.Generator] = {}
        self.is_pooling = task == "embed" or (task == "auto" and hasattr(model, "pool")
                                              and not hasattr(model, "compute_logits"))
        if self.is_pooling and not hasattr(model, "pool"):
            raise ValueError(f"{type(model).__name__} cannot produce embeddings (it has no pooler); use a model "
                             "whose architecture supports task='embed'.")
        # A graph runner (e.g. CUDA graphs) may replace ``forward_fn`` for decode batches; see ``forward``.
        self.graph_runner = None

    def release(self, request_ids: list[str]) -> None:
        """Forget per-request state (seeded generators) of finished requests."""
        for rid in request_ids:
            self.generators.pop(rid, None)

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        if self.graph_runner is not None:  # a captured decode step brings its own static metadata
            hidden = self.graph_runner.maybe_run(inputs)
            if hidden is not None:
                return hidden
        # models without paged attention (encoders attending within each request) need no metadata
        metadata = self.attn_backend_cls.build_metadata(inputs.layout, self.device) if self.attn_backend_cls else None
        ctx = ForwardContext(attn_metadata=metadata, query_start_loc=inputs.query_start_loc)
        return self.model(inputs.input_ids, inputs.positions, ctx)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        inputs = build_step_inputs(out, self.block_size, self.device)
        hidden = self.forward(inputs)
        result = ModelRunnerOutput()
        reqs = {s.req.request_id: s.req for s in out.scheduled}

        if inputs.pooling_req_ids:
            ctx = ForwardContext(attn_metadata=None, query_start_loc=inputs.query_start_loc)
            pooled = self.model.pool(hidden, ctx)  # [num_reqs, dim], one row per scheduled request
            order = [s.req.request_id for s in out.scheduled]
            pooled_host = pooled.float().cpu()
            for rid in inputs.pooling_req_ids:
                result.pooled[rid] = pooled_host[order.index(rid)].tolist()
        if not inputs.sample_req_ids and not inputs.prompt_lp_rows:
            return result

        # Device work first: sampling and (prompt) logprobs; then one transfer to the host.
        pending = {}
        if inputs.sample_req_ids:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            sample_reqs = [reqs[rid] for rid in inputs.sample_req_ids]
            batch = build_sampling_batch(sample_reqs, self.vocab_size, self.device, self.generators)
            so = self.sampler(logits, batch)
            pending["sampled"] = so.sampled
            if so.logprobs is not None:
                pending["lp_ids"], pending["lp"], pending["ranks"] = so.logprob_token_ids, so.logprobs, so.sampled_ranks
        for rid, (rows, targets, _) in inputs.prompt_lp_rows.items():
            k = reqs[rid].sampling_params.prompt_logprobs
            lp = compute_logprobs(self.model.compute_logits(hidden[rows.to(self.device)]))
            pending[("plp", rid)] = gather_logprobs(lp, targets.to(self.device), k)
        host = _to_host(pending, self.synchronize)

        if "sampled" in host:
            tokens = host["sampled"].tolist()
            for i, rid in enumerate(inputs.sample_req_ids):
                result.sampled[rid] = tokens[i]
                want = reqs[rid].sampling_params.logprobs
                if want is not None:
                    result.logprobs[rid] = _row_logprobs(host["lp_ids"][i], host["lp"][i], int(host["ranks"][i]), want)
        for rid, (_, _, first_pos) in inputs.prompt_lp_rows.items():
            ids, lps, ranks = host[("plp", rid)]
            k = reqs[rid].sampling_params.prompt_logprobs
            entries = [_row_logprobs(ids[j], lps[j], int(ranks[j]), k) for j in range(ids.shape[0])]
            result.prompt_logprobs[rid] = (first_pos, entries)
        return result


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
