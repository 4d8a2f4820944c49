"""Mixtral: Mistral attention (sliding window when the config sets one) with a sparse mixture of experts.

Each layer's ``block_sparse_moe`` holds a router (``gate``) and ``FusedMoE`` experts: softmax over the
router logits, top-k (``num_experts_per_tok``), always renormalised. The checkpoint's per-expert ``w1``
(gate), ``w3`` (up) and ``w2`` (down) load into the stacked expert weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from octavo.nn import ParallelLMHead, ReplicatedLinear, RMSNorm
from octavo.nn.fused_moe import FusedMoE
from octavo.nn.pipeline import build_lm_head
from octavo.plugins.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from octavo.plugins.models.utils import split_expert_weights


class MixtralSparseMoeBlock(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.gate = ReplicatedLinear(config.hidden_size, config.num_local_experts, bias=False,
                                     prefix=f"{prefix}.gate")
        self.experts = FusedMoE(config.num_local_experts, config.num_experts_per_tok, config.hidden_size,
                                config.intermediate_size, renormalize=True, activation=config.hidden_act,
                                prefix=f"{prefix}.experts")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))  # [n, hidden]


class MixtralDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        nn.Module.__init__(self)
        self.self_attn = LlamaAttention(config, layer_idx, prefix=f"{prefix}.self_attn")
        if getattr(config, "layer_types", None) is None and getattr(config, "sliding_window", None):
            self.self_attn.attn.sliding_window = config.sliding_window  # Llama only reads it for model_type mistral
        self.block_sparse_moe = MixtralSparseMoeBlock(config, prefix=f"{prefix}.block_sparse_moe")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @property
    def mlp(self):  # LlamaDecoderLayer.forward calls self.mlp
        return self.block_sparse_moe


class MixtralModel(LlamaModel):
    decoder_layer = MixtralDecoderLayer


class MixtralForCausalLM(LlamaForCausalLM):
    """Mixtral causal LM.

    Args:
        config: a transformers ``MixtralConfig``.
        prefix: name prefix of this model's parameters.
    """

    supports_pipeline_parallel = True  # octavo.nn.pipeline

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        nn.Module.__init__(self)
        self.config = config
        self.model = MixtralModel(config=config, prefix=f"{prefix}.model" if prefix else "model")
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = build_lm_head(lambda: ParallelLMHead(config.vocab_size, config.hidden_size),
                                     self.model.embed_tokens, self.tie_word_embeddings)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        experts: set[str] = set()
        loaded = super().load_weights(split_expert_weights(self, weights, experts))
        return loaded | experts

