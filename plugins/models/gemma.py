"""Gemma, Gemma 2 and Gemma 3 (text): one decoder with the features each generation switches on.

- all: embeddings scaled by ``sqrt(hidden_size)`` (rounded to the compute dtype, as transformers does),
  RMSNorm computing ``x * (1 + w)``, GeGLU MLP (``gelu_pytorch_tanh``), tied LM head.
- Gemma 2: ``query_pre_attn_scalar`` sets the attention scale, ``attn_logit_softcapping`` caps attention
  scores and ``final_logit_softcapping`` the logits (``cap * tanh(x / cap)``), ``layer_types`` alternates
  sliding-window and global layers, and each sub-block has a norm before and after it.
- Gemma 3: Gemma 2's layout plus per-head ``q_norm`` / ``k_norm``, and a rope base per layer type
  (``rope_parameters["sliding_attention"]`` / ``["full_attention"]``).

The attention backend applies the sliding window and the score cap (``Attention(sliding_window=...,
logits_soft_cap=...)``). Gemma3ForCausalLM is the text-only checkpoint (``model_type: gemma3_text``, e.g.
gemma-3-1b); the multimodal Gemma3ForConditionalGeneration is not supported.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from octavo.model import ForwardContext
from octavo.nn import (
    Attention,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    get_act_and_mul,
    get_rope,
    rope_config,
)
from octavo.plugins.models.llama import LlamaForCausalLM


class GemmaRMSNorm(RMSNorm):
    """RMSNorm with weight ``1 + w`` (Gemma checkpoints store ``w`` around zero), in float32."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * (1.0 + self.weight.float())).to(dtype)


def _act_name(config: Any) -> str:
    # Gemma 1 configs name it hidden_act (legacy "gelu" means the tanh approximation), later ones hidden_activation
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "gelu_pytorch_tanh")
    return "gelu_pytorch_tanh" if name == "gelu" else name


def _rope_for_layer(config: Any, layer_type: str | None):
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        return rope_config(SimpleNamespace(rope_parameters=params[layer_type]))  # Gemma 3: per layer type
    return rope_config(config)


class GemmaAttention(nn.Module):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        super().__init__()
        self.head_dim = config.head_dim
        total_heads, total_kv = config.num_attention_heads, config.num_key_value_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, total_heads, total_kv, bias=bias,
                                          prefix=f"{prefix}.qkv_proj")
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, config.hidden_size, bias=bias,
                                        prefix=f"{prefix}.o_proj")
        layer_types = getattr(config, "layer_types", None)
        layer_type = layer_types[layer_idx] if layer_types else None
        base, scaling, partial = _rope_for_layer(config, layer_type)
        self.rotary_emb = get_rope(self.head_dim, config.max_position_embeddings, base, scaling,
                                   rotary_dim=int(self.head_dim * partial))
        self.qk_norm = config.model_type == "gemma3_text"
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        scalar = getattr(config, "query_pre_attn_scalar", None) or self.head_dim
        window = config.sliding_window if layer_type == "sliding_attention" else None
        self.attn = Attention(self.num_heads, self.head_dim, scalar**-0.5, self.num_kv_heads,
                              sliding_window=window, logits_soft_cap=getattr(config, "attn_logit_softcapping", None),
                              prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        n = hidden_states.shape[0]
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(n, self.num_heads, self.head_dim)).reshape(n, self.q_size)
            k = self.k_norm(k.reshape(n, self.num_kv_heads, self.head_dim)).reshape(n, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))  # [n, hidden]


class GemmaMLP(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], bias=False,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=False, prefix=f"{prefix}.down_proj")
        self.act_fn = get_act_and_mul(_act_name(config))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = GemmaAttention(config, layer_idx, prefix=f"{prefix}.self_attn")
        self.mlp = GemmaMLP(config, prefix=f"{prefix}.mlp")
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=eps)
        # Gemma 2/3 ("sandwich"): the attention output is normed before the residual add, and the MLP is
        # wrapped in pre/post norms; Gemma 1 is the plain pre-norm layout.
        self.sandwich = config.model_type != "gemma"
        if self.sandwich:
            self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps=eps)
            self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps=eps)

    def forward(self, positions, hidden_states, residual, ctx):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, ctx)
        if not self.sandwich:
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            return self.mlp(hidden_states), residual
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states, residual = self.pre_feedforward_layernorm(hidden_states, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden_states)), residual


class GemmaModel(nn.Module):
    def __init__(self, *, config: Any, prefix: str = "model") -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i, prefix=f"{prefix}.layers.{i}")
                                    for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)  # [n, hidden]
        # the scale is rounded to the compute dtype first, exactly like transformers
        hidden_states = hidden_states * torch.tensor(self.hidden_size**0.5, dtype=hidden_states.dtype)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, ctx)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma / Gemma 2 / Gemma 3 text causal LM (the variant follows ``config.model_type``).

    Args:
        config: ``GemmaConfig``, ``Gemma2Config`` or ``Gemma3TextConfig``.
        prefix: name prefix of this model's parameters.
    """

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        nn.Module.__init__(self)
        self.config = config
        self.model = GemmaModel(config=config, prefix=f"{prefix}.model" if prefix else "model")
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        # Gemma checkpoints always tie the head to the embedding (transformers' default for these configs)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[m, hidden_size]`` -> ``[m, vocab_size]`` float32 logits, soft-capped when the config says so."""
        logits = self.lm_head.compute_logits(hidden_states)
        if self.final_logit_softcapping:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits


class Gemma2ForCausalLM(GemmaForCausalLM):
    """Gemma 2 (soft-capping, alternating sliding/global layers, sandwich norms)."""


class Gemma3ForCausalLM(GemmaForCausalLM):
    """Gemma 3 text (Gemma 2 plus q/k norms and per-layer-type rope)."""

