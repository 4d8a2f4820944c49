"""Gated activations over a fused ``[..., 2 * d]`` input (the output of ``gate_up_proj``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(x[..., :d]) * x[..., d:]``: the SwiGLU of Llama-family MLPs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(nn.Module):
    """``gelu(x[..., :d]) * x[..., d:]`` (GeGLU); ``approximate="tanh"`` for Gemma's ``gelu_pytorch_tanh``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up


_ACTIVATIONS = {"silu": SiluAndMul, "swiglu": SiluAndMul, "gelu": GeluAndMul,
                "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"), "gelu_new": lambda: GeluAndMul("tanh")}


def get_act_and_mul(name: str) -> nn.Module:
    """The gated activation for a config's ``hidden_act`` name."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"hidden_act={name!r} is not supported; known: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()
