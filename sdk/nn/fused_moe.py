"""``FusedMoE``: a mixture-of-experts feed-forward layer with top-k routing and stacked expert weights.

All experts' weights live in two stacked parameters, ``w13_weight [E, 2 * I, H]`` (gate and up projections,
fused like ``gate_up_proj``) and ``w2_weight [E, H, I]`` (down projection), so a checkpoint's per-expert
tensors load with ``weight_loader(param, tensor, shard_id="w1"|"w3"|"w2", expert_id=e)``. Under tensor
parallelism each rank keeps a slice of every expert's intermediate dimension and the partial outputs are
summed across ranks, like a column-parallel / row-parallel MLP pair. With expert parallelism
(``enable_expert_parallel``, :func:`octavo.nn.parallel.set_expert_parallel`) each rank instead keeps
``E / tp`` whole experts (a contiguous range), runs every token's routed experts that it holds (the others
weigh zero) and the same all-reduce sums the ranks' outputs: each token's k experts are counted exactly once.

Routing (:meth:`FusedMoE.select_experts`): softmax over the router logits in float32, top-k, then
optionally renormalise the k weights to sum to one (Mixtral always does; Qwen3-MoE when
``norm_topk_prob``). The expert computation (:meth:`FusedMoE.apply_experts`) is the seam for kernels: the
torch path here groups tokens by expert (sort by expert id, one matmul pair per expert that has tokens,
``index_add_`` back), so each expert's weights are read once per step. On CUDA the platform assigns
``layer.apply_experts`` to a fused Triton kernel (``octavo.plugins.platforms.cuda_moe``; graph-safe; off with
``OCTAVO_MOE_TRITON=0``; docs/moe.md); another kernel can do the same or override it in a subclass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.nn.activation import get_act_and_mul
from octavo.nn.linear import set_weight_attrs
from octavo.nn.parallel import divide, expert_parallel_enabled, get_tp_rank, get_tp_size, tp_all_reduce


class FusedMoE(nn.Module):
    """Top-k routed experts with gated MLPs (``down(act(gate(x)) * up(x))``).

    Args:
        num_experts: experts in the layer.
        top_k: experts each token is routed to.
        hidden_size: model width ``H``.
        intermediate_size: each expert's intermediate width ``I`` (full, before tensor-parallel splitting).
        renormalize: rescale each token's top-k routing weights to sum to one.
        activation: the config's ``hidden_act`` (``silu`` for Mixtral and Qwen3-MoE).
        reduce_results: all-reduce the partial outputs across tensor-parallel ranks.
        prefix: the layer's dotted name (for messages).
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 renormalize: bool = True, activation: str = "silu", reduce_results: bool = True,
                 prefix: str = "") -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"{prefix}: top_k={top_k} must be between 1 and num_experts={num_experts}")
        self.num_experts, self.top_k, self.hidden_size = num_experts, top_k, hidden_size
        self.renormalize, self.reduce_results, self.prefix = renormalize, reduce_results, prefix
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.expert_parallel = expert_parallel_enabled() and self.tp_size > 1
        if self.expert_parallel:  # whole experts [expert_start, expert_start + num_local_experts) on this rank
            self.num_local_experts = divide(num_experts, self.tp_size, f"{prefix} num_experts")
            self.expert_start = self.tp_rank * self.num_local_experts
            self._shards, self._shard = 1, 0  # each local expert is whole
        else:
            self.num_local_experts, self.expert_start = num_experts, 0
            self._shards, self._shard = self.tp_size, self.tp_rank
        self.intermediate_size = divide(intermediate_size, self._shards, f"{prefix} moe_intermediate_size")
        self.act_fn = get_act_and_mul(activation)
        inter, local = self.intermediate_size, self.num_local_experts
        self.w13_weight = nn.Parameter(torch.empty(local, 2 * inter, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(local, hidden_size, inter), requires_grad=False)
        for param in (self.w13_weight, self.w2_weight):
            set_weight_attrs(param, weight_loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None,
                      expert_id: int | None = None) -> None:
        """Copy one expert's projection into the stacked parameter.

        Args:
            param: ``w13_weight`` or ``w2_weight``.
            loaded: the checkpoint tensor of one expert: gate (``w1``) or up (``w3``) ``[I, H]``, or down
                (``w2``) ``[H, I]``; or, with ``expert_id=None``, the whole stacked parameter.
            shard_id: ``"w1"``, ``"w3"`` or ``"w2"``.
            expert_id: which expert.
        """
        if expert_id is None:
            if self.expert_parallel and loaded.shape[0] == self.num_experts:  # this rank's experts of the stack
                loaded = loaded.narrow(0, self.expert_start, self.num_local_experts)
            if loaded.shape != param.shape:
                raise ValueError(f"{self.prefix}: stacked expert tensor of shape {tuple(loaded.shape)} does not "
                                 f"fit {tuple(param.shape)}")
            param.data.copy_(loaded)
            return
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"{self.prefix}: expert {expert_id} does not exist (num_experts={self.num_experts})")
        if shard_id not in ("w1", "w3", "w2"):
            raise ValueError(f"{self.prefix}: shard_id must be 'w1', 'w3' or 'w2', got {shard_id!r}")
        inter = self.intermediate_size
        full = (inter * self._shards, self.hidden_size) if shard_id in ("w1", "w3") else \
            (self.hidden_size, inter * self._shards)
        if tuple(loaded.shape) != full:
            raise ValueError(f"{self.prefix}: expert {expert_id} {shard_id} of shape {tuple(loaded.shape)} does "
                             f"not fit {full} (hidden_size={self.hidden_size}, intermediate_size="
                             f"{inter * self._shards}); is the config.json the checkpoint's?")
        local = expert_id - self.expert_start
        if not 0 <= local < self.num_local_experts:
            return  # expert parallelism: another rank holds this expert
        if shard_id in ("w1", "w3"):
            part = loaded.narrow(0, self._shard * inter, inter)  # this rank's rows of gate / up
            offset = 0 if shard_id == "w1" else inter
            dest = param.data[local].narrow(0, offset, inter)
        else:
            part = loaded.narrow(1, self._shard * inter, inter)  # this rank's input columns of down
            dest = param.data[local]
        dest.copy_(part)

    def select_experts(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[n, E]`` router logits -> (``[n, k]`` float32 weights, ``[n, k]`` int64 expert ids)."""
        probs = torch.softmax(router_logits.float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def apply_experts(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """Grouped torch path: ``x [n, H]`` through each token's k experts, weighted and summed -> ``[n, H]``.

        Override (or assign) this for a fused kernel; the contract is exactly these inputs and output.
        ``topk_ids`` index this rank's experts (``0 .. num_local_experts - 1``; ``num_local_experts`` itself
        means "held by another rank", with weight 0, under expert parallelism).
        While a CUDA graph is being captured the per-expert token counts cannot be read on the host, so
        :meth:`apply_experts_static` (shape-static, graph-safe) runs instead.
        """
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.apply_experts_static(x, topk_weights, topk_ids)
        flat_ids = topk_ids.reshape(-1)  # [n * k]
        order = torch.argsort(flat_ids, stable=True)  # token-slots grouped by expert
        token_of = order // self.top_k  # [n * k] source token of each sorted slot
        slot_weights = topk_weights.reshape(-1)[order].to(x.dtype)
        # one host read of the per-expert counts: the grouping needs Python-side slice bounds
        counts = torch.bincount(flat_ids, minlength=self.num_local_experts).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts[:self.num_local_experts]):  # id num_local_experts: held elsewhere
            if count == 0:
                continue
            tokens = token_of[start:start + count]
            h = self.act_fn(F.linear(x[tokens], self.w13_weight[expert]))  # [count, I]
            h = F.linear(h, self.w2_weight[expert]) * slot_weights[start:start + count, None]  # [count, H]
            out.index_add_(0, tokens, h)
            start += count
        return out

    def apply_experts_static(self, x: torch.Tensor, topk_weights: torch.Tensor,
                             topk_ids: torch.Tensor) -> torch.Tensor:
        """Same result as :meth:`apply_experts` with no host sync: every expert runs on every token and is
        weighted by that token's routing weight for it (zero when not chosen). E/k times the FLOPs: meant for
        small decode batches under CUDA-graph capture."""
        dense = torch.zeros(x.shape[0], self.num_local_experts + 1, dtype=x.dtype, device=x.device)
        dense.scatter_(1, topk_ids, topk_weights.to(x.dtype))  # [n, E_local + 1]; the last: held elsewhere
        out = torch.zeros_like(x)
        for expert in range(self.num_local_experts):
            h = F.linear(self.act_fn(F.linear(x, self.w13_weight[expert])), self.w2_weight[expert])
            out = out + h * dense[:, expert, None]
        return out

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``hidden_states [n, H]``, ``router_logits [n, E]`` -> ``[n, H]``."""
        topk_weights, topk_ids = self.select_experts(router_logits)
        if self.expert_parallel:  # local ids; experts of other ranks -> id num_local_experts with weight 0
            local = (topk_ids >= self.expert_start) & (topk_ids < self.expert_start + self.num_local_experts)
            topk_weights = topk_weights.masked_fill(~local, 0.0)
            topk_ids = torch.where(local, topk_ids - self.expert_start, self.num_local_experts)
        out = self.apply_experts(hidden_states, topk_weights, topk_ids)
        if self.tp_size > 1 and self.reduce_results:
            out = tp_all_reduce(out)
        return out

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, "
                f"intermediate={self.intermediate_size}, renormalize={self.renormalize}, tp={self.tp_size}, "
                f"local_experts={self.num_local_experts}")
