"""OPT (facebook/opt-125m ... 66b): learned positions offset by 2, LayerNorm, ReLU MLP, tied LM head.

Variants from the config: ``do_layer_norm_before=False`` (opt-350m) normalises after each residual add and
drops the final norm; ``word_embed_proj_dim != hidden_size`` (opt-350m) adds ``project_in`` /
``project_out`` around the decoder. Checkpoints whose names lack the ``model.`` prefix are accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from octavo.model import ForwardContext
from octavo.nn import (
    Attention,
    ColumnParallelLinear,
    LayerNorm,
    ParallelLMHead,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    default_weight_loader,
)
from octavo.plugins.models.utils import LastTokenPooler

_ACTS = {"relu": torch.relu, "gelu": torch.nn.functional.gelu}
_POSITION_OFFSET = 2  # OPT's learned position table starts at index 2 (fairseq legacy)


class OPTAttention(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.head_dim = hidden // heads
        bias = getattr(config, "enable_bias", True)
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias=bias, prefix=f"{prefix}.qkv_proj")
        self.out_proj = RowParallelLinear(hidden, hidden, bias=bias, prefix=f"{prefix}.out_proj")
        self.q_size = self.qkv_proj.num_heads * self.head_dim
        self.attn = Attention(self.qkv_proj.num_heads, self.head_dim, self.head_dim**-0.5, self.qkv_proj.num_heads,
                              prefix=f"{prefix}.attn")

    def forward(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size] * 3, dim=-1)
        return self.out_proj(self.attn(q, k, v, ctx))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        bias = getattr(config, "enable_bias", True)
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config, prefix=f"{prefix}.self_attn")
        self.self_attn_layer_norm = LayerNorm(config.hidden_size)
        self.fc1 = ColumnParallelLinear(config.hidden_size, config.ffn_dim, bias=bias, prefix=f"{prefix}.fc1")
        self.fc2 = RowParallelLinear(config.ffn_dim, config.hidden_size, bias=bias, prefix=f"{prefix}.fc2")
        self.final_layer_norm = LayerNorm(config.hidden_size)
        if config.activation_function not in _ACTS:
            raise ValueError(f"OPT activation_function={config.activation_function!r} is not supported; "
                             f"known: {sorted(_ACTS)}")
        self.act = _ACTS[config.activation_function]

    def forward(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        residual = hidden_states
        if self.pre_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states = residual + self.self_attn(hidden_states, ctx)
        if not self.pre_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        residual = hidden_states
        if self.pre_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = residual + self.fc2(self.act(self.fc1(hidden_states)))
        if not self.pre_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


class OPTDecoder(nn.Module):
    def __init__(self, config: Any, prefix: str = "model.decoder") -> None:
        super().__init__()
        proj = config.word_embed_proj_dim
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, proj)
        self.embed_positions = VocabParallelEmbedding(config.max_position_embeddings + _POSITION_OFFSET,
                                                      config.hidden_size)
        if proj != config.hidden_size:
            self.project_in = ReplicatedLinear(proj, config.hidden_size, bias=False)
            self.project_out = ReplicatedLinear(config.hidden_size, proj, bias=False)
        else:
            self.project_in = self.project_out = None
        # transformers keeps the final norm only for pre-norm models (opt-350m has none)
        keep_final = config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False)
        self.final_layer_norm = LayerNorm(config.hidden_size) if keep_final else None
        self.layers = nn.ModuleList(OPTDecoderLayer(config, prefix=f"{prefix}.layers.{i}")
                                    for i in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        if self.project_in is not None:
            hidden_states = self.project_in(hidden_states)
        hidden_states = hidden_states + self.embed_positions(positions + _POSITION_OFFSET)  # [n, hidden]
        for layer in self.layers:
            hidden_states = layer(hidden_states, ctx)
        if self.final_layer_norm is not None:
            hidden_states = self.final_layer_norm(hidden_states)
        if self.project_out is not None:
            hidden_states = self.project_out(hidden_states)
        return hidden_states


class OPTModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(LastTokenPooler, nn.Module):
    """OPT causal LM.

    Args:
        config: a transformers ``OPTConfig``.
        prefix: name prefix of this model's parameters.
    """

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    supports_quantization = False  # the loader refuses a quantization setting for this model

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.model = OPTModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.word_embed_proj_dim)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.decoder.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n]`` token ids and positions -> ``[n, word_embed_proj_dim]`` final hidden states."""
        return self.model.decoder(input_ids, positions, ctx)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[m, word_embed_proj_dim]`` -> ``[m, vocab_size]`` float32 logits."""
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load OPT checkpoint tensors; q/k/v go into the fused ``qkv_proj``."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.startswith("decoder."):
                name = "model." + name
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            shard_id = None
            for part, sid in ((".q_proj.", "q"), (".k_proj.", "k"), (".v_proj.", "v")):
                if part in name:
                    name, shard_id = name.replace(part, ".qkv_proj."), sid
                    break
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in OPTForCausalLM; is the "
                                 "checkpoint's config.json the right one?")
            param = params[name]
            if shard_id is not None:
                param.weight_loader(param, tensor, shard_id)
            else:
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        if self.tie_word_embeddings:
            loaded.add("lm_head.weight")
        return loaded

