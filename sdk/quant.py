"""The ``Quantizer`` interface: a quantization scheme, keyed by the checkpoint's ``quant_method``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from octavo.platform import Availability

if TYPE_CHECKING:
    import torch


class LinearMethod(ABC):
    """How one linear layer creates, loads, post-processes and applies its (quantized) weights."""

    @abstractmethod
    def create_weights(
        self, layer: torch.nn.Module, input_size: int, output_sizes: list[int], params_dtype: torch.dtype
    ) -> None:
        """Register the layer's parameters (each with a ``weight_loader`` attribute)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Repack or transpose loaded weights into the layout ``apply`` wants (runs once, after loading)."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W^T (+ bias)`` with this scheme's weights."""


class Quantizer(ABC):
    """A quantization scheme. Registered under its Hugging Face ``quant_method`` name."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> Quantizer:
        """Build from the checkpoint's ``quantization_config`` dict."""

    @abstractmethod
    def supports(self, platform: Any) -> Availability:
        """Whether this scheme runs on ``platform`` (a :class:`octavo.Platform`)."""

    @abstractmethod
    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        """The method for the linear layer at ``layer_prefix``, or None to leave it unquantized."""
