"""The Llama family: LlamaForCausalLM (SmolLM2, Llama 2/3/3.1/3.2), MistralForCausalLM and Qwen2ForCausalLM.

One decoder, three registrations: Mistral is Llama with a sliding window, Qwen2 is Llama with a bias on
q/k/v (and per-layer sliding windows via ``layer_types``). Built from ``octavo.nn`` layers over a flat token
batch; checkpoint q/k/v and gate/up tensors load into the fused ``qkv_proj`` and ``gate_up_proj`` through
``packed_modules_mapping`` and each parameter's ``weight_loader``.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
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
    default_weight_loader,
    get_act_and_mul,
    get_rope,
    rope_config,
)
from octavo.nn.pipeline import (
    IntermediateTensors,
    PPMissingLayer,
    build_lm_head,
    is_first_stage,
    is_last_stage,
    make_layers,
    missing_prefixes,
    stage_input,
    tied_head_name,
)
from octavo.plugins.models.utils import LastTokenPooler


def _sliding_window(config: Any, layer_idx: int) -> int | None:
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:  # transformers 5.x: per-layer "sliding_attention" / "full_attention"
        return config.sliding_window if layer_types[layer_idx] == "sliding_attention" else None
    if config.model_type == "mistral":
        return getattr(config, "sliding_window", None)
    return None


class LlamaMLP(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], bias=bias,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=bias,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = get_act_and_mul(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # [n, hidden]


class LlamaAttention(nn.Module):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        super().__init__()
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = getattr(config, "num_key_value_heads", None) or self.total_num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.total_num_heads
        qkv_bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
        o_bias = config.model_type != "qwen2" and getattr(config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, self.total_num_heads,
                                          self.total_num_kv_heads, bias=qkv_bias,
                                          prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, config.hidden_size, bias=o_bias,
                                        prefix=f"{prefix}.o_proj")
        base, scaling, partial = rope_config(config)
        max_position = config.max_position_embeddings
        if scaling is not None:
            scaling = dict(scaling)
            scaling.setdefault("original_max_position_embeddings", config.max_position_embeddings)
            if scaling.get("rope_type", scaling.get("type")) in ("linear", "dynamic"):
                max_position = int(max_position * scaling["factor"])
        self.rotary_emb = get_rope(self.head_dim, max_position, base, scaling,
                                   rotary_dim=int(self.head_dim * partial))
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads,
                              sliding_window=_sliding_window(config, layer_idx), prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)  # [n, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))  # [n, hidden]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int, prefix: str = "") -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, prefix=f"{prefix}.self_attn")
        self.mlp = LlamaMLP(config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual, ctx):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, ctx)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    decoder_layer: type[nn.Module] = LlamaDecoderLayer  # subclasses with another layer (Mixtral, Qwen3) set theirs

    def __init__(self, *, config: Any, prefix: str = "model") -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size) if is_first_stage() \
            else PPMissingLayer()  # pipeline stages build only their part (octavo.nn.pipeline)
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, lambda i: self.decoder_layer(config, i, prefix=f"{prefix}.layers.{i}"))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps) if is_last_stage() else PPMissingLayer()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext):
        """``[n, hidden]`` final hidden states, or on a pipeline stage before the last its IntermediateTensors."""
        received = stage_input(ctx)  # None unless this is a later pipeline stage
        if received is None:
            hidden_states, residual = self.embed_tokens(input_ids), None  # [n, hidden]
        else:
            hidden_states, residual = received
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual, ctx)
        if not is_last_stage():
            return IntermediateTensors(hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(LastTokenPooler, nn.Module):
    """A Llama-family causal LM over flat token batches (see the module docstring for the variants).

    Args:
        config: the transformers config (``LlamaConfig``, ``MistralConfig`` or ``Qwen2Config``).
        prefix: name prefix of this model's parameters (empty at the top level).
    """

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    #: splits into pipeline stages (octavo.nn.pipeline); read from the class itself, never inherited, since a
    #: subclass that reshapes the model must say so again
    supports_pipeline_parallel = True

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config=config, prefix=f"{prefix}.model" if prefix else "model")
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = build_lm_head(lambda: ParallelLMHead(config.vocab_size, config.hidden_size),
                                     self.model.embed_tokens, self.tie_word_embeddings)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n]`` token ids and positions -> ``[n, hidden_size]`` final hidden states."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[m, hidden_size]`` -> ``[m, vocab_size]`` float32 logits."""
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load ``(checkpoint name, tensor)`` pairs; returns the names of the parameters that were filled."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        other_stage = missing_prefixes(self)  # pipeline parallelism: tensors of layers another stage holds
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or "rotary_emb.cos_cached" in name:
                continue  # computed, not loaded
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue  # tied: the embedding is the head
            name = tied_head_name(name, "model.embed_tokens.weight", self.model.embed_tokens, self.lm_head,
                                  self.tie_word_embeddings)
            if other_stage and name.startswith(other_stage):
                continue
            # checkpoint part -> (fused parameter, shard index), from packed_modules_mapping; quantized
            # parts (qweight / scales / zeros) load through the same table
            for fused, shard, shard_id in self._stacked():
                if shard in name and fused not in name:
                    target = name.replace(shard, fused)
                    param = self._param(params, target, name)
                    param.weight_loader(param, tensor, shard_id)
                    loaded.add(target)
                    break
            else:
                param = self._param(params, name, name)
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                loaded.add(name)
        if self.tie_word_embeddings and "model.embed_tokens.weight" in loaded:
            loaded.add("lm_head.weight")
        return loaded

    @classmethod
    def _stacked(cls) -> list[tuple[str, str, int]]:
        return [(f".{fused}", f".{part}", i) for fused, parts in cls.packed_modules_mapping.items()
                for i, part in enumerate(parts)]

    @staticmethod
    def _param(params: dict[str, nn.Parameter], target: str, source: str) -> nn.Parameter:
        if target not in params:
            raise ValueError(f"checkpoint tensor {source!r} has no matching parameter ({target!r}) in "
                             "LlamaForCausalLM; is the checkpoint's config.json the right one?")
        return params[target]


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama with a sliding window from the config."""

    supports_pipeline_parallel = True


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: Llama with a bias on q/k/v (chosen from ``config.model_type == "qwen2"``)."""

    supports_pipeline_parallel = True
