"""Rotary position embeddings with Hugging Face's rope scaling types.

``get_rope`` returns a module that rotates q and k in place of their positions. Frequencies follow
``transformers.modeling_rope_utils`` for the types ``default``, ``linear``, ``dynamic``, ``yarn`` and
``llama3``; cos/sin are precomputed in float32 for every position up to ``max_position`` and shared by all
layers with the same parameters. ``rope_config(config)`` reads both transformers 5.x ``rope_parameters``
and the older ``rope_theta`` / ``rope_scaling`` attributes.

NOTE on ``dynamic``: transformers rescales the base from the longest sequence of the current batch, which
has no meaning in a batch of independent requests. Here each position ``p`` uses the base transformers would
use for a sequence of length ``p + 1``: identical to transformers within ``max_position_embeddings``, and a
position's rotation never changes, so cached keys stay valid.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def rope_config(config: Any) -> tuple[float, dict[str, Any] | None, float]:
    """``(rope_theta, rope_scaling or None, partial_rotary_factor)`` from a transformers config."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        params = dict(params)
    else:  # transformers 4.x
        params = dict(getattr(config, "rope_scaling", None) or {})
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    base = float(params.pop("rope_theta"))
    partial = float(params.pop("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0) or 1.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    return base, (None if rope_type == "default" else params), partial


def _inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _yarn(base, dim, s, max_position) -> tuple[torch.Tensor, float]:
    factor = s.get("factor") or max_position / s["original_max_position_embeddings"]
    orig = s["original_max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attention_factor = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp  # share of the unscaled frequency per dimension
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _llama3(base, dim, s) -> torch.Tensor:
    inv_freq = _inv_freq(base, dim)
    factor, low_ff, high_ff = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low_ff, old_len / high_ff
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def compute_cos_sin(rotary_dim: int, max_position: int, base: float,
                    rope_scaling: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``cos, sin`` of shape ``[max_position, rotary_dim // 2]`` for one rope configuration."""
    s = rope_scaling or {}
    rope_type = s.get("rope_type", s.get("type", "default"))
    positions = torch.arange(max_position, dtype=torch.float32)
    attention_factor = 1.0
    if rope_type == "default":
        freqs = torch.outer(positions, _inv_freq(base, rotary_dim))
    elif rope_type == "linear":
        freqs = torch.outer(positions, _inv_freq(base, rotary_dim) / s["factor"])
    elif rope_type == "llama3":
        freqs = torch.outer(positions, _llama3(base, rotary_dim, s))
    elif rope_type == "yarn":
        inv_freq, attention_factor = _yarn(base, rotary_dim, s, max_position)
        freqs = torch.outer(positions, inv_freq)
    elif rope_type == "dynamic":
        factor = s["factor"]
        orig = s.get("original_max_position_embeddings") or s["max_position_embeddings"]
        seq_len = torch.clamp(positions + 1, min=orig)  # [max_position]
        scaled_base = base * ((factor * seq_len / orig) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        inv_freq = 1.0 / scaled_base[:, None] ** exponents[None, :]  # [max_position, rotary_dim // 2]
        freqs = positions[:, None] * inv_freq
    else:
        raise ValueError(f"rope_type={rope_type!r} is not supported; octavo supports default, linear, dynamic, "
                         "yarn and llama3")
    return freqs.cos() * attention_factor, freqs.sin() * attention_factor


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to q and k of a flat token batch.

    Args:
        head_size: features per head.
        rotary_dim: leading features of each head that rotate (``head_size`` unless partial rotary).
        cos, sin: float32 ``[max_position, rotary_dim // 2]`` tables from :func:`compute_cos_sin`.
        is_neox_style: rotate the two halves (Hugging Face Llama layout) rather than interleaved pairs.
    """

    def __init__(self, head_size: int, rotary_dim: int, cos: torch.Tensor, sin: torch.Tensor,
                 is_neox_style: bool = True) -> None:
        super().__init__()
        self.head_size, self.rotary_dim, self.is_neox_style = head_size, rotary_dim, is_neox_style
        # buffers (not parameters): never loaded from a checkpoint, follow .to(device)
        self.register_buffer("cos_cache", cos, persistent=False)
        self.register_buffer("sin_cache", sin, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x = x.view(shape[0], -1, self.head_size)  # [num_tokens, num_heads, head_size]
        rot = x[..., : self.rotary_dim].float()
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        out = torch.cat((o1, o2), dim=-1) if self.is_neox_style else torch.stack((o1, o2), dim=-1).flatten(-2)
        if self.rotary_dim < self.head_size:
            out = torch.cat((out.to(dtype), x[..., self.rotary_dim:]), dim=-1)
        return out.to(dtype).reshape(shape)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """``positions [n]``, ``query [n, h*d]``, ``key [n, kv_h*d]`` -> rotated ``(query, key)``, same shapes."""
        cos = self.cos_cache[positions].unsqueeze(1)  # [n, 1, rotary_dim // 2]
        sin = self.sin_cache[positions].unsqueeze(1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, max_position={self.cos_cache.shape[0]}"


_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def get_rope(head_size: int, max_position: int, base: float, rope_scaling: dict[str, Any] | None = None,
             *, rotary_dim: int | None = None, is_neox_style: bool = True) -> RotaryEmbedding:
    """A rotary embedding for one configuration; layers with equal arguments share the cos/sin tables.

    Args:
        head_size: features per head.
        max_position: positions to precompute (the model's longest context).
        base: ``rope_theta``.
        rope_scaling: the Hugging Face rope parameters without ``rope_theta`` (``{"rope_type": "llama3",
            "factor": 8.0, ...}``), or None for plain rope.
        rotary_dim: rotating features per head (partial rotary); default ``head_size``.
        is_neox_style: True for the Hugging Face Llama layout.
    """
    rotary_dim = rotary_dim or head_size
    device = torch.get_default_device()
    key = (rotary_dim, max_position, base, repr(sorted((rope_scaling or {}).items())), str(device))
    if key not in _TABLES:
        with torch.device("cpu"):
            cos, sin = compute_cos_sin(rotary_dim, max_position, base, rope_scaling)
        _TABLES[key] = (cos.to(device), sin.to(device))
    cos, sin = _TABLES[key]
    return RotaryEmbedding(head_size, rotary_dim, cos, sin, is_neox_style)
