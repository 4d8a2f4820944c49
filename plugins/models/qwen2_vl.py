"""Qwen2-VL (``Qwen2VLForConditionalGeneration``): its own vision transformer (2D rotary, dynamic resolution, a
2x2 patch merger) and a Qwen2 language model with M-RoPE (rotary positions in three sections: time, height,
width).

Why this shape: the language model is octavo's Qwen2 (paged attention, flat token batches) with each layer's
rotary replaced by :class:`MRotaryEmbedding`, which takes either ``[n]`` positions (text: the three sections
share one position, so it is plain rope) or ``[3, n]`` (a step that runs image placeholders). The runner
computes those positions (core/multimodal_rope.py) from each image's grid, so a chunked prefill or a decode
step gets the same positions transformers' ``get_rope_index`` gives the whole sequence, and decode continues
from the rope delta. The vision tower is plain PyTorch, replicated: images of any size are packed into one
``[patches, C*T*P*P]`` tensor and attend only within themselves (``cu_seqlens``), as transformers does.

Images only (no video). Checkpoint layouts: the Hub's (``model.layers.*``, ``visual.*``) and transformers
5's in-memory one (``model.language_model.*``, ``model.visual.*``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from octavo.model import ForwardContext
from octavo.nn.rotary import RotaryEmbedding
from octavo.plugins.models.llama import LlamaForCausalLM
from octavo.plugins.models.utils import forward_with_image_embeds


class MRotaryEmbedding(RotaryEmbedding):
    """Rope whose frequency dimensions are split into sections, section ``i`` rotated by position row ``i``
    (transformers' Qwen2-VL ``mrope_section``); ``[n]`` positions mean all rows equal (plain rope)."""

    def __init__(self, base: RotaryEmbedding, sections: list[int]) -> None:
        super().__init__(base.head_size, base.rotary_dim, base.cos_cache, base.sin_cache, base.is_neox_style)
        if sum(sections) != base.rotary_dim // 2:
            raise ValueError(f"mrope_section {sections} must sum to head_dim / 2 = {base.rotary_dim // 2}")
        self.sections = list(sections)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        if positions.dim() == 1:
            return super().forward(positions, query, key)
        cos = torch.cat([c[positions[i % 3]] for i, c in enumerate(self.cos_cache.split(self.sections, -1))], -1)
        sin = torch.cat([s[positions[i % 3]] for i, s in enumerate(self.sin_cache.split(self.sections, -1))], -1)
        return self._rotate(query, cos.unsqueeze(1), sin.unsqueeze(1)), self._rotate(key, cos.unsqueeze(1),
                                                                                      sin.unsqueeze(1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class VisionBlock(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        d = cfg.embed_dim
        self.num_heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(d, 3 * d)
        self.attn.proj = nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(d, int(d * cfg.mlp_ratio))
        self.mlp.fc2 = nn.Linear(int(d * cfg.mlp_ratio), d)
        self.act = ACT2FN[cfg.hidden_act]

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        n, d = x.shape
        q, k, v = self.attn.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)  # [n, heads, head_dim] each
        dtype = q.dtype
        c, s = cos[:, None].float(), sin[:, None].float()
        q = (q.float() * c + _rotate_half(q.float()) * s).to(dtype)
        k = (k.float() * c + _rotate_half(k.float()) * s).to(dtype)
        outs = [F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1))
                for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths))]  # per image
        return self.attn.proj(torch.cat(outs, dim=1).transpose(0, 1).reshape(n, d))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp.fc2(self.act(self.mlp.fc1(x)))

    def forward(self, x, cos, sin, lengths):
        x = x + self.attention(self.norm1(x), cos, sin, lengths)
        return x + self.feed_forward(self.norm2(x))


class Qwen2VisionTransformer(nn.Module):
    """Packed patches of any number of images ``[N, C*T*P*P]`` + their grids ``[k, 3]`` -> merged embeddings
    ``[N / merge**2, text hidden]`` in image order."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.merge = cfg.spatial_merge_size
        self.in_channels, self.tp, self.patch = cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size
        self.embed_dim = cfg.embed_dim
        self.patch_embed = nn.Module()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, cfg.embed_dim, kernel, stride=kernel, bias=False)
        head_dim = cfg.embed_dim // cfg.num_heads
        theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        spatial = head_dim // 2
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial),
                             persistent=False)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        ctx = cfg.embed_dim * self.merge ** 2
        self.merger = nn.Module()
        self.merger.ln_q = nn.LayerNorm(cfg.embed_dim, eps=1e-6)
        self.merger.mlp = nn.Sequential(nn.Linear(ctx, ctx), nn.GELU(), nn.Linear(ctx, cfg.hidden_size))

    def _positions(self, grids: list[list[int]], device) -> torch.Tensor:
        """``[N, 2]`` (row, column) of each patch, in the processor's merge-block-major order."""
        m, out = self.merge, []
        for t, h, w in grids:
            hh, ww = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
            block = (h // m, m, w // m, m)
            hh, ww = hh.reshape(block).transpose(1, 2).flatten(), ww.reshape(block).transpose(1, 2).flatten()
            out.append(torch.stack([hh, ww], dim=-1).repeat(t, 1))
        return torch.cat(out)

    def forward(self, pixels: torch.Tensor, grids: list[list[int]]) -> torch.Tensor:
        w = self.patch_embed.proj.weight
        x = self.patch_embed.proj(pixels.view(-1, self.in_channels, self.tp, self.patch, self.patch).to(w.dtype))
        x = x.view(-1, self.embed_dim)
        freqs = self._positions(grids, x.device)[..., None].float() * self.inv_freq  # [N, 2, head_dim / 4]
        freqs = freqs.flatten(1)  # (row freqs, column freqs)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        lengths = [h * w for t, h, w in grids for _ in range(t)]  # each frame attends within itself
        for blk in self.blocks:
            x = blk(x, cos, sin, lengths)
        mg = self.merger
        return mg.mlp(mg.ln_q(x).view(-1, self.embed_dim * self.merge ** 2))


class Qwen2VLForConditionalGeneration(nn.Module):
    """Qwen2-VL over flat token batches; image embeddings arrive through ``ctx.extra["mm_embeds"]``."""

    packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping
    supported_modalities = ("image",)
    embeds_packed_images = True  # embed_images takes packed patches + grids (core/multimodal_runner.py)
    vision_class = Qwen2VisionTransformer  # Qwen2.5-VL swaps in its windowed one (plugins/models/qwen2_5_vl.py)

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        vcfg, tcfg = config.vision_config, copy.copy(config.text_config)
        #: the runner gives ``[3, n]`` positions when a step runs image tokens (core/multimodal_rope.py)
        self.mrope_spatial_merge_size = vcfg.spatial_merge_size
        tcfg.model_type = "qwen2"  # octavo's Llama reads this for the q/k/v bias
        tcfg.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False)
                                        or getattr(config.text_config, "tie_word_embeddings", False))
        rope = getattr(tcfg, "rope_parameters", None) or getattr(tcfg, "rope_scaling", None) or {}
        sections = rope.get("mrope_section")
        if not sections:
            raise ValueError("Qwen2-VL text config has no rope mrope_section; is this a Qwen2-VL checkpoint?")
        self.visual = self.vision_class(vcfg)
        self.language_model = LlamaForCausalLM(config=tcfg, prefix="language_model")
        for layer in self.language_model.model.layers:
            layer.self_attn.rotary_emb = MRotaryEmbedding(layer.self_attn.rotary_emb, sections)

    @torch.inference_mode()
    def embed_images(self, pixels: torch.Tensor, grids: list[list[int]]) -> torch.Tensor:
        """Packed ``[N, C*T*P*P]`` patches of several images -> ``[sum of placeholders, text hidden]``."""
        return self.visual(pixels, grids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return forward_with_image_embeds(self.language_model, input_ids, positions, ctx)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        own = dict(self.named_parameters())
        loaded: set[str] = set()
        text: list[tuple[str, torch.Tensor]] = []
        for name, tensor in weights:
            if name.startswith("model.visual."):
                name = name.removeprefix("model.")
            elif name.startswith("model.language_model."):
                name = "model." + name.removeprefix("model.language_model.")
            if name.startswith("visual."):
                if name not in own:
                    raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in "
                                     "Qwen2VLForConditionalGeneration")
                with torch.no_grad():
                    own[name].copy_(tensor)
                loaded.add(name)
            else:
                text.append((name, tensor))
        loaded |= {f"language_model.{n}" for n in self.language_model.load_weights(text)}
        return loaded
