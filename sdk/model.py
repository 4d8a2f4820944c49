"""The model protocol: what a model plugin's class must provide.

A model is plain PyTorch built from ``octavo.nn`` layers. It runs over a flat batch of tokens with no
padding; the per-step attention metadata arrives in a :class:`ForwardContext`, never through a global.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@dataclass
class ForwardContext:
    """Per-step state every layer may read during ``forward``.

    Attributes:
        attn_metadata: what the attention backend's ``build_metadata`` returned for this step.
        query_start_loc: int32 ``[num_reqs + 1]`` on the device: request boundaries in the flat batch
            (pooling models use it to pool per request).
        extra: room for plugins (e.g. LoRA mappings) without widening the signature.
    """

    attn_metadata: Any
    query_start_loc: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ModelProtocol(Protocol):
    """A generative model class, registered under its Hugging Face ``architectures`` name.

    Construction: ``Model(*, config, prefix="")`` where ``config`` is the ``transformers`` config.
    Parameters are created in the dtype and on the device that are current when it is built
    (``torch.set_default_dtype`` / ``torch.device(...)`` context), so nothing is allocated twice.
    """

    #: checkpoint shard names -> fused parameter: ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``.
    packed_modules_mapping: ClassVar[dict[str, list[str]]]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[num_tokens]`` ids and positions -> ``[num_tokens, hidden_size]`` hidden states."""

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[n, hidden_size]`` -> ``[n, vocab_size]`` float logits (only rows the sampler needs)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Consume ``(checkpoint name, tensor)`` pairs; return the parameter names that were loaded."""


@runtime_checkable
class PoolingModelProtocol(Protocol):
    """An embedding model: ``forward`` as above, then ``pool`` turns hidden states into one vector per request."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor: ...

    def pool(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[num_tokens, hidden]`` -> ``[num_reqs, dim]`` embeddings (normalized if the model says so)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]: ...
