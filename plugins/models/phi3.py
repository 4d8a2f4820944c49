"""Phi-3: a Llama-shaped decoder whose checkpoint stores q/k/v fused (``qkv_proj``) and gate/up fused
(``gate_up_proj``), with a sliding window on every layer when the config sets ``sliding_window``.

The fused checkpoint tensors are split into their q, k, v (and gate, up) parts before loading, so the
per-part weight loaders shard them correctly under tensor parallelism. Partial rotary comes from
``partial_rotary_factor``; Phi-3's ``longrope`` scaling (128k variants) is not supported by
``octavo.nn.rotary`` and fails at build time with the list of supported rope types.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from octavo.plugins.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 causal LM.

    Args:
        config: a transformers ``Phi3Config``.
        prefix: name prefix of this model's parameters.
    """

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__(config=config, prefix=prefix)
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "layer_types", None) is None:
            for layer in self.model.layers:  # transformers applies the window on every Phi-3 layer
                layer.self_attn.attn.sliding_window = window
        attn = self.model.layers[0].self_attn
        self._qkv_sizes = [attn.head_dim * config.num_attention_heads,
                           attn.head_dim * attn.total_num_kv_heads, attn.head_dim * attn.total_num_kv_heads]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._split_fused(weights))

    def _split_fused(self, weights):
        for name, tensor in weights:
            if ".qkv_proj." in name:  # [q; k; v] rows -> the q_proj / k_proj / v_proj names Llama loads
                for part, piece in zip(("q_proj", "k_proj", "v_proj"), tensor.split(self._qkv_sizes, dim=0)):
                    yield name.replace("qkv_proj", part), piece
            elif ".gate_up_proj." in name:
                gate, up = tensor.chunk(2, dim=0)
                yield name.replace("gate_up_proj", "gate_proj"), gate
                yield name.replace("gate_up_proj", "up_proj"), up
            else:
                yield name, tensor

