"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): Qwen2-VL with a windowed vision transformer.

What differs from Qwen2-VL (plugins/models/qwen2_vl.py, which this reuses): the ViT blocks use RMSNorm and a
gated SiLU MLP with biases, the merger's norm is RMSNorm, and most blocks attend within windows of
``window_size`` pixels (``fullatt_block_indexes`` attend over the whole image). As transformers does, the
patches are permuted once so each window is contiguous, the blocks run over that order, and the merged
output is permuted back. The language model, M-RoPE positions (images: the same ``get_rope_index`` rule)
and the processor are Qwen2-VL's. Images only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from octavo.plugins.models.qwen2_vl import (
    Qwen2VisionTransformer,
    Qwen2VLForConditionalGeneration,
    VisionBlock,
)


class VisionRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        return self.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class WindowVisionBlock(VisionBlock):
    def __init__(self, cfg: Any) -> None:
        nn.Module.__init__(self)
        d, inter = cfg.hidden_size, cfg.intermediate_size
        self.num_heads = cfg.num_heads
        self.norm1, self.norm2 = VisionRMSNorm(d), VisionRMSNorm(d)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(d, 3 * d)
        self.attn.proj = nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, inter)
        self.mlp.up_proj = nn.Linear(d, inter)
        self.mlp.down_proj = nn.Linear(inter, d)
        self.act = ACT2FN[cfg.hidden_act]

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.mlp
        return m.down_proj(self.act(m.gate_proj(x)) * m.up_proj(x))


def window_order(grids: list[list[int]], merge: int, window: int, patch: int) -> tuple[torch.Tensor, list[int]]:
    """Merged-patch order that makes each attention window contiguous, and the window sizes in patches
    (transformers' ``get_vision_window_index``)."""
    per = window // merge // patch  # window side in merged patches
    order, sizes, base = [], [], 0
    for t, h, w in grids:
        gh, gw = h // merge, w // merge
        index = torch.arange(t * gh * gw).reshape(t, gh, gw)
        ph, pw = per - gh % per, per - gw % per
        nh, nw = (gh + ph) // per, (gw + pw) // per
        padded = F.pad(index, (0, pw, 0, ph), value=-100).reshape(t, nh, per, nw, per)
        padded = padded.permute(0, 1, 3, 2, 4).reshape(t, nh * nw, per * per)
        counts = (padded != -100).sum(-1).reshape(-1)
        flat = padded.reshape(-1)
        order.append(flat[flat != -100] + base)
        sizes += [int(c) * merge * merge for c in counts if c > 0]
        base += t * gh * gw
    return torch.cat(order), sizes


class Qwen25VisionTransformer(Qwen2VisionTransformer):
    def __init__(self, cfg: Any) -> None:
        nn.Module.__init__(self)
        self.merge = cfg.spatial_merge_size
        self.in_channels, self.tp, self.patch = cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size
        self.embed_dim = cfg.hidden_size
        self.window_size = cfg.window_size
        self.full_blocks = set(cfg.fullatt_block_indexes)
        self.patch_embed = nn.Module()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel, stride=kernel, bias=False)
        head_dim = cfg.hidden_size // cfg.num_heads
        theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        spatial = head_dim // 2
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial),
                             persistent=False)
        self.blocks = nn.ModuleList(WindowVisionBlock(cfg) for _ in range(cfg.depth))
        ctx = cfg.hidden_size * self.merge ** 2
        self.merger = nn.Module()
        self.merger.ln_q = VisionRMSNorm(cfg.hidden_size)
        self.merger.mlp = nn.Sequential(nn.Linear(ctx, ctx), nn.GELU(), nn.Linear(ctx, cfg.out_hidden_size))

    def forward(self, pixels: torch.Tensor, grids: list[list[int]]) -> torch.Tensor:
        w = self.patch_embed.proj.weight
        x = self.patch_embed.proj(pixels.view(-1, self.in_channels, self.tp, self.patch, self.patch).to(w.dtype))
        x = x.view(-1, self.embed_dim)
        n, unit = x.shape[0], self.merge ** 2
        order, window_sizes = window_order(grids, self.merge, self.window_size, self.patch)
        order = order.to(x.device)

        def permute(y: torch.Tensor) -> torch.Tensor:  # whole merge blocks move together
            return y.reshape(n // unit, unit, -1)[order].reshape(n, -1)

        freqs = (self._positions(grids, x.device)[..., None].float() * self.inv_freq.float()).flatten(1)
        emb = permute(torch.cat([freqs, freqs], dim=-1))
        cos, sin = emb.cos(), emb.sin()
        x = permute(x)
        full = [h * w for t, h, w in grids for _ in range(t)]
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, full if i in self.full_blocks else window_sizes)
        mg = self.merger
        merged = mg.mlp(mg.ln_q(x).view(-1, self.embed_dim * unit))
        return merged[torch.argsort(order)]


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):  # noqa: N801 - the HF name
    """Qwen2.5-VL over flat token batches (see the module docstring)."""

    vision_class = Qwen25VisionTransformer
