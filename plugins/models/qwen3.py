"""Qwen3 (dense) and Qwen3-MoE: Llama-style decoders with a per-head RMSNorm on q and k before rotary.

Qwen3ForCausalLM reuses the Llama family's MLP, decoder layer forward and weight loading; only the attention
differs (``q_norm`` / ``k_norm`` over ``head_dim``, no q/k/v bias unless ``attention_bias``). Qwen3-MoE swaps
the MLP of the sparse layers for a router + :class:`~octavo.nn.fused_moe.FusedMoE` (softmax top-k,
renormalised when ``norm_topk_prob``); layers in ``mlp_only_layers`` or off the ``decoder_sparse_step``
keep a dense MLP. Both pool the last token (L2-normalised) under ``task="embed"`` (Qwen3-Embedding).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from octavo.model import ForwardContext
from octavo.nn import ReplicatedLinear, RMSNorm
from octavo.nn.fused_moe import FusedMoE
from octavo.nn.pipeline import build_lm_head
from octavo.plugins.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
)
from octavo.plugins.models.utils import split_expert_weights


class Qwen3Attention(LlamaAttention):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        super().__init__(config, layer_idx, prefix)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        n = hidden_states.shape[0]
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(n, self.num_heads, self.head_dim)).reshape(n, self.q_size)
        k = self.k_norm(k.reshape(n, self.num_kv_heads, self.head_dim)).reshape(n, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))  # [n, hidden]


class Qwen3MoeSparseBlock(nn.Module):
    """Router + experts; ``gate`` and ``experts`` match the checkpoint's ``mlp.gate`` / ``mlp.experts.<e>``."""

    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts, bias=False, prefix=f"{prefix}.gate")
        self.experts = FusedMoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                                config.moe_intermediate_size, renormalize=bool(config.norm_topk_prob),
                                activation=config.hidden_act, prefix=f"{prefix}.experts")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))  # [n, hidden]


class Qwen3DecoderLayer(LlamaDecoderLayer):
    """Llama's layer (same forward) with Qwen3 attention and, for MoE configs, a sparse MLP where due."""

    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        nn.Module.__init__(self)  # not LlamaDecoderLayer.__init__: it would build (and allocate) Llama attention
        self.self_attn = Qwen3Attention(config, layer_idx, prefix=f"{prefix}.self_attn")
        num_experts = getattr(config, "num_experts", 0) or 0
        sparse = (num_experts > 0 and layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
                  and (layer_idx + 1) % getattr(config, "decoder_sparse_step", 1) == 0)
        self.mlp = Qwen3MoeSparseBlock(config, prefix=f"{prefix}.mlp") if sparse else \
            LlamaMLP(config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Qwen3Model(LlamaModel):
    decoder_layer = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense causal LM (also Qwen3-Embedding under ``task="embed"``).

    Args:
        config: a transformers ``Qwen3Config``.
        prefix: name prefix of this model's parameters.
    """

    model_class = Qwen3Model
    supports_pipeline_parallel = True  # octavo.nn.pipeline

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        from octavo.nn import ParallelLMHead

        nn.Module.__init__(self)
        self.config = config
        self.model = self.model_class(config=config,
                                      prefix=f"{prefix}.model" if prefix else "model")
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = build_lm_head(lambda: ParallelLMHead(config.vocab_size, config.hidden_size),
                                     self.model.embed_tokens, self.tie_word_embeddings)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE: Qwen3 attention, sparse expert MLPs (checkpoint experts load into stacked weights)."""

    supports_pipeline_parallel = True

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        experts: set[str] = set()
        loaded = super().load_weights(split_expert_weights(self, weights, experts))
        return loaded | experts

