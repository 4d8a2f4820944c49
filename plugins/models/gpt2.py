"""GPT-2: learned absolute positions, pre-LayerNorm blocks, a GELU (tanh) MLP, and the LM head tied to ``wte``.

GPT-2 checkpoints store their projections as ``Conv1D`` weights of shape ``[in, out]``: they are transposed
on load, and the fused ``c_attn`` tensor is split into q, k, v so the per-part loaders shard it for tensor
parallelism. Old checkpoints without the ``transformer.`` prefix and their ``attn.bias`` mask buffers are
accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from octavo.model import ForwardContext
from octavo.nn import (
    Attention,
    ColumnParallelLinear,
    LayerNorm,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    default_weight_loader,
)
from octavo.plugins.models.utils import LastTokenPooler

_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


class GPT2Attention(nn.Module):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        super().__init__()
        hidden, heads = config.n_embd, config.n_head
        self.head_dim = hidden // heads
        self.c_attn = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias=True, prefix=f"{prefix}.c_attn")
        self.c_proj = RowParallelLinear(hidden, hidden, bias=True, prefix=f"{prefix}.c_proj")
        self.q_size = self.c_attn.num_heads * self.head_dim
        scale = self.head_dim**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(layer_idx + 1)
        self.attn = Attention(self.c_attn.num_heads, self.head_dim, scale, self.c_attn.num_heads,
                              prefix=f"{prefix}.attn")

    def forward(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.c_attn(hidden_states).split([self.q_size] * 3, dim=-1)
        return self.c_proj(self.attn(q, k, v, ctx))


class GPT2MLP(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        inner = config.n_inner or 4 * config.n_embd
        self.c_fc = ColumnParallelLinear(config.n_embd, inner, bias=True, prefix=f"{prefix}.c_fc")
        self.c_proj = RowParallelLinear(inner, config.n_embd, bias=True, prefix=f"{prefix}.c_proj")
        act = config.activation_function
        if act not in _GELU:
            raise ValueError(f"GPT-2 activation_function={act!r} is not supported; known: {sorted(_GELU)}")
        self.approximate = _GELU[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class GPT2Block(nn.Module):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        super().__init__()
        eps = config.layer_norm_epsilon
        self.ln_1 = LayerNorm(config.n_embd, eps=eps)
        self.attn = GPT2Attention(config, layer_idx, prefix=f"{prefix}.attn")
        self.ln_2 = LayerNorm(config.n_embd, eps=eps)
        self.mlp = GPT2MLP(config, prefix=f"{prefix}.mlp")

    def forward(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states), ctx)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPT2Model(nn.Module):
    def __init__(self, config: Any, prefix: str = "transformer") -> None:
        super().__init__()
        self.wte = VocabParallelEmbedding(config.vocab_size, config.n_embd)
        self.wpe = VocabParallelEmbedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(GPT2Block(config, i, prefix=f"{prefix}.h.{i}") for i in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden_states = self.wte(input_ids) + self.wpe(positions)  # [n, hidden]
        for block in self.h:
            hidden_states = block(hidden_states, ctx)
        return self.ln_f(hidden_states)


class GPT2LMHeadModel(LastTokenPooler, nn.Module):
    """GPT-2 causal LM (``architectures: ["GPT2LMHeadModel"]``).

    Args:
        config: a transformers ``GPT2Config``.
        prefix: name prefix of this model's parameters.
    """

    packed_modules_mapping = {"c_attn": ["c_attn"]}  # fused in the checkpoint already

    supports_quantization = False  # the loader refuses a quantization setting for this model

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.n_embd).tie_weights(self.transformer.wte)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n]`` token ids and positions -> ``[n, n_embd]`` final hidden states."""
        return self.transformer(input_ids, positions, ctx)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[m, n_embd]`` -> ``[m, vocab_size]`` float32 logits."""
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load GPT-2 checkpoint tensors (Conv1D ``[in, out]`` weights are transposed)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        hidden = self.config.n_embd
        for name, tensor in weights:
            if name.startswith("lm_head.") or name.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # tied head; causal-mask buffers of old checkpoints
            if not name.startswith("transformer."):
                name = "transformer." + name
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in GPT2LMHeadModel")
            param = params[name]
            is_conv1d = name.endswith(".weight") and any(m in name for m in (".c_attn.", ".c_proj.", ".c_fc."))
            if is_conv1d:
                tensor = tensor.t()  # Conv1D stores [in, out]
            if ".c_attn." in name:
                for shard_id, piece in zip("qkv", tensor.split(hidden, dim=0)):
                    param.weight_loader(param, piece, shard_id)
            else:
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        loaded.add("lm_head.weight")  # tied to transformer.wte
        return loaded

