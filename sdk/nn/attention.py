"""The paged ``Attention`` layer: a shape holder that delegates to the attention backend bound at run time.

A model builds ``Attention(num_heads, head_size, scale, num_kv_heads)`` without knowing which backend will
run it. The model runner later finds every such layer (``model.modules()``) and calls
``layer.bind(impl, kv_cache)`` with a backend instance built for that layer's shape and the layer's slice of
the KV cache. Per-step metadata arrives through the :class:`~octavo.ForwardContext`, never a global.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from octavo.attention import AttentionBackend
    from octavo.model import ForwardContext


class Attention(nn.Module):
    """Paged causal self-attention over a flat token batch.

    Args:
        num_heads: query heads on this rank.
        head_size: features per head.
        scale: softmax scale, usually ``head_size ** -0.5``.
        num_kv_heads: key/value heads on this rank (grouped-query attention when fewer than ``num_heads``).
        sliding_window: each token sees only the last ``sliding_window`` positions (itself included).
        logits_soft_cap: scores become ``cap * tanh(scores / cap)`` before the softmax.
        prefix: the layer's dotted name in the model (used in messages and by backends that key on it).
    """

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None, *,
                 sliding_window: int | None = None, logits_soft_cap: float | None = None, prefix: str = "") -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{prefix}: num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.prefix = prefix
        self.impl: AttentionBackend | None = None
        self.kv_cache: torch.Tensor | None = None

    def bind(self, impl: AttentionBackend, kv_cache: torch.Tensor) -> None:
        """Attach the backend instance that runs this layer and the layer's KV-cache tensor."""
        self.impl = impl
        self.kv_cache = kv_cache

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``q [n, num_heads * head_size]``, ``k``/``v [n, num_kv_heads * head_size]`` -> ``[n, num_heads * head_size]``.

        Writes k/v into this layer's cache, then attends; 3-D ``[n, heads, head_size]`` inputs work as well.
        """
        if self.impl is None:
            raise RuntimeError(f"attention layer {self.prefix!r} has no backend: the model runner must call "
                               "layer.bind(impl, kv_cache) before the first forward")
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_size)  # [n, num_heads, head_size]
        k = k.view(num_tokens, self.num_kv_heads, self.head_size)  # [n, num_kv_heads, head_size]
        v = v.view(num_tokens, self.num_kv_heads, self.head_size)
        out = self.impl.forward(q, k, v, self.kv_cache, ctx.attn_metadata)
        return out.reshape(num_tokens, self.num_heads * self.head_size)  # [n, num_heads * head_size]

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_size={self.head_size}, "
                f"sliding_window={self.sliding_window}, soft_cap={self.logits_soft_cap}")
