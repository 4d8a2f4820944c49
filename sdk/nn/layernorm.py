"""Normalisation layers, with the fused residual-add variant the decoder layers use.

``forward(x, residual)`` computes ``residual = x + residual`` then normalises it, returning both, so a
decoder layer threads one residual stream through its two norms without a separate add (vLLM's form).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.nn.linear import default_weight_loader, set_weight_attrs


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like Hugging Face's ``LlamaRMSNorm``.

    Args:
        hidden_size: features of the last dimension.
        eps: added to the mean square before the square root.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        set_weight_attrs(self.weight, weight_loader=default_weight_loader)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)  # one fused kernel
        # low precision: normalise in float32, round, then scale in the input dtype (transformers' order)
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normalise ``x``; with ``residual``, normalise ``x + residual`` and return ``(normed, x + residual)``."""
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual


class LayerNorm(nn.Module):
    """Layer norm with weight and (optional) bias, and the same fused residual variant as :class:`RMSNorm`."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(hidden_size), requires_grad=False) if bias else None
        for p in self.parameters(recurse=False):
            set_weight_attrs(p, weight_loader=default_weight_loader)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            residual = x + residual
            x = residual
        out = F.layer_norm(x.float(), x.shape[-1:], self.weight.float(),
                           None if self.bias is None else self.bias.float(), self.eps).to(x.dtype)
        return out if residual is None else (out, residual)
