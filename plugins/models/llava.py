"""LLaVA-1.5 (``LlavaForConditionalGeneration``): a CLIP vision tower, a two-layer projector and a Llama.

Why this shape: the language model is octavo's own Llama (paged attention, flat token batches); the vision
tower is plain PyTorch (it attends within one image, so it needs no KV cache and is replicated on every
rank). The runner calls :meth:`embed_images` on the images of scheduled requests (core/multimodal_runner.py,
through an encoder cache) and hands the rows of the image embeddings that fall in this step's tokens to
``forward`` as ``ctx.extra["mm_embeds"] = (flat token indices, [k, hidden] embeddings)``; ``forward`` writes
them over the token embeddings of the image placeholders, as transformers' ``inputs_embeds`` merge does.

Supported: ``vision_feature_layer`` an int, ``vision_feature_select_strategy`` "default" or "full" (the
LLaVA-1.5 checkpoints). A list of feature layers (LLaVA-NeXT style) is refused at construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from octavo.model import ForwardContext
from octavo.plugins.models.llama import LlamaForCausalLM
from octavo.plugins.models.utils import forward_with_image_embeds


class CLIPAttention(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // self.num_heads
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, t, d] -> [b, t, d]
        b, t, d = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.self_attn = CLIPAttention(cfg)
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.mlp.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp.fc2(self.act(self.mlp.fc1(self.layer_norm2(x))))


class CLIPVisionTower(nn.Module):
    """CLIP's vision transformer up to the feature layer LLaVA reads (later layers are never built)."""

    def __init__(self, cfg: Any, num_layers: int) -> None:
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.class_embedding = nn.Parameter(torch.empty(cfg.hidden_size))
        self.embeddings.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size,
                                                    stride=cfg.patch_size, bias=False)
        num_positions = (cfg.image_size // cfg.patch_size) ** 2 + 1
        self.embeddings.position_embedding = nn.Embedding(num_positions, cfg.hidden_size)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(CLIPEncoderLayer(cfg) for _ in range(num_layers))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [b, 3, H, W] -> [b, 1 + patches, d]
        e = self.embeddings
        patches = e.patch_embedding(pixel_values.to(e.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        cls = e.class_embedding.expand(patches.shape[0], 1, -1)
        x = torch.cat([cls, patches], dim=1) + e.position_embedding.weight[None]
        x = self.pre_layrnorm(x)
        for layer in self.encoder.layers:
            x = layer(x)
        return x


class LlavaForConditionalGeneration(nn.Module):
    """LLaVA-1.5 over flat token batches; image embeddings arrive through ``ctx.extra["mm_embeds"]``."""

    packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping
    supported_modalities = ("image",)

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        layer = config.vision_feature_layer
        if not isinstance(layer, int):
            raise ValueError(f"LLaVA vision_feature_layer={layer!r}: only a single int layer (LLaVA-1.5) is "
                             "supported in octavo")
        strategy = config.vision_feature_select_strategy
        if strategy not in ("default", "full"):
            raise ValueError(f"LLaVA vision_feature_select_strategy={strategy!r} is not supported "
                             "(expected 'default' or 'full')")
        vcfg = config.vision_config
        total = vcfg.num_hidden_layers
        num_layers = layer + 1 if layer >= 0 else total + layer + 1  # hidden_states[0] is the embeddings
        self.vision_tower = CLIPVisionTower(vcfg, num_layers)
        text_hidden = config.text_config.hidden_size
        bias = getattr(config, "multimodal_projector_bias", True)
        self.multi_modal_projector = nn.Module()
        self.multi_modal_projector.linear_1 = nn.Linear(vcfg.hidden_size, text_hidden, bias=bias)
        self.multi_modal_projector.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)
        self.projector_act = ACT2FN[config.projector_hidden_act]
        self.drop_cls = strategy == "default"
        self.language_model = LlamaForCausalLM(config=config.text_config, prefix="language_model")

    @torch.inference_mode()
    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[b, 3, H, W]`` -> ``[b, tokens_per_image, text_hidden]`` (what replaces each image's placeholders)."""
        feats = self.vision_tower(pixel_values)
        if self.drop_cls:
            feats = feats[:, 1:]
        p = self.multi_modal_projector
        return p.linear_2(self.projector_act(p.linear_1(feats)))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return forward_with_image_embeds(self.language_model, input_ids, positions, ctx)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Both checkpoint layouts: ``language_model.model.*`` / ``vision_tower.vision_model.*`` (LLaVA-1.5 on
        the Hub) and ``model.language_model.*`` / ``model.vision_tower.*`` (transformers >= 4.52)."""
        own = dict(self.named_parameters())
        loaded: set[str] = set()
        text: list[tuple[str, torch.Tensor]] = []
        for name, tensor in weights:
            name = name.removeprefix("model.") if not name.startswith("model.layers") else name
            if name.startswith("language_model.model.") or name.startswith("language_model.lm_head."):
                text.append((name.removeprefix("language_model."), tensor))
            elif name.startswith("language_model."):  # new layout: language_model.<LlamaModel part>
                text.append(("model." + name.removeprefix("language_model."), tensor))
            elif name.startswith("lm_head."):
                text.append((name, tensor))
            else:
                name = name.replace("vision_tower.vision_model.", "vision_tower.")
                if name not in own:
                    if name.startswith("vision_tower."):  # post_layernorm, layers past the feature layer
                        continue
                    raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in "
                                     "LlavaForConditionalGeneration")
                with torch.no_grad():
                    own[name].copy_(tensor)
                loaded.add(name)
        loaded |= {f"language_model.{n}" for n in self.language_model.load_weights(text)}
        return loaded
