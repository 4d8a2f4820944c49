"""The ``AttentionBackend`` interface and the per-step batch layout every backend receives.

Data flow per step::

    Scheduler -> ModelRunner builds an AttentionLayout (flat token batch, block tables, slot mapping)
              -> backend_cls.build_metadata(layout, device)      once per step, outside the layers
              -> model.forward(input_ids, positions, ForwardContext(attn_metadata=...))
                   -> each Attention layer: backend.forward(q, k, v, kv_cache, attn_metadata)

Metadata is always passed explicitly; no backend may keep per-step state in a module global.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from octavo.platform import Availability

if TYPE_CHECKING:
    import torch


@dataclass
class AttentionLayout:
    """The batch layout of one step, on the host, in the order the requests appear in the flat batch.

    Tokens of request ``i`` occupy ``query_start_loc[i]:query_start_loc[i + 1]`` in the flat batch. Its
    new tokens sit at context positions ``num_computed_tokens[i] .. seq_lens[i] - 1``; the first
    ``num_computed_tokens[i]`` positions are already in the paged cache (earlier chunks or prefix-cache hits).

    Attributes:
        query_start_loc: int32 ``[num_reqs + 1]`` cumulative new-token counts.
        seq_lens: int32 ``[num_reqs]`` context length after this step (cached + new tokens).
        num_computed_tokens: int32 ``[num_reqs]`` tokens already in the cache before this step.
        block_tables: int32 ``[num_reqs, max_blocks_per_req]`` physical block ids, padded with 0 (the
            null block, never read for valid positions).
        slot_mapping: int64 ``[num_tokens]`` cache slot (``block_id * block_size + offset``) each new
            token's K/V is written to.
        block_size: tokens per KV block.
        max_query_len: largest new-token count of any request this step.
        max_seq_len: largest ``seq_lens`` entry.
        num_decode_reqs: leading requests with exactly one new token (decode-only) — backends may take a
            faster path for them; the scheduler orders decodes first.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    num_computed_tokens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    block_size: int
    max_query_len: int
    max_seq_len: int
    num_decode_reqs: int = 0

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])


class AttentionBackend(ABC):
    """A paged-attention implementation.

    One instance per attention layer, built with that layer's shape. Class methods describe the backend
    and the cache it needs; ``forward`` writes the new K/V into the paged cache, then attends over it.
    """

    #: registry name, e.g. ``"torch_sdpa"``.
    name: ClassVar[str]
    #: platform name -> rank among the backends auto-selected there (higher is tried first). A backend lists the
    #: platforms it is built for, so a new backend is auto-selected without editing any platform. Backends
    #: without an entry for a platform are tried there only when named (``--attention-backend``) or preferred by
    #: the platform; the reference ``torch_sdpa`` is the last resort everywhere.
    platform_priority: ClassVar[dict[str, int]] = {}

    @classmethod
    def is_available(cls) -> Availability:
        """Whether the backend's dependencies are importable here (cheap; no kernel compilation)."""
        return Availability(True)

    @classmethod
    @abstractmethod
    def supports(
        cls,
        *,
        device_type: str,
        dtype: torch.dtype,
        head_size: int,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        block_size: int = 16,
    ) -> Availability:
        """Whether this backend handles a layer of this shape on this device, with the reason if not."""

    @classmethod
    def kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor. Default: ``[2, num_blocks, block_size, num_kv_heads, head_size]``
        (index 0 holds keys, 1 values)."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def build_metadata(cls, layout: AttentionLayout, device: torch.device) -> Any:
        """Turn the host-side layout into whatever ``forward`` needs on ``device``. Runs once per step."""
        return layout

    def __init__(
        self,
        *,
        num_heads: int,
        head_size: int,
        num_kv_heads: int,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: Any,
    ) -> torch.Tensor:
        """Write ``key``/``value`` into ``kv_cache`` at the layout's slots, then attend.

        Args:
            query: ``[num_tokens, num_heads, head_size]``.
            key: ``[num_tokens, num_kv_heads, head_size]``.
            value: ``[num_tokens, num_kv_heads, head_size]``.
            kv_cache: this layer's cache, shaped as :meth:`kv_cache_shape` says.
            metadata: what :meth:`build_metadata` returned for this step.

        Returns:
            ``[num_tokens, num_heads, head_size]``: causal attention of each new token over its request's
            context (cached positions plus the new tokens up to and including itself), honouring
            ``sliding_window`` (a token sees the last ``sliding_window`` positions, itself included) and
            ``logits_soft_cap`` (``cap * tanh(scores / cap)``).
        """
