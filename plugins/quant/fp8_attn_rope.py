"""Batch-1 decode: the rotary embedding inside the one-launch fp8 attention (session 15, engineer fp815;
``OCTAVO_FP8_ATTN_ROPE``, on by default since its H100 A/B: captured forward -14 us, 3 of 3 below every default,
tokens equal, the kernel's GPU test passed; ``0`` turns it off).

Why: at one row the layer runs qkv GEMV -> rotary -> attention (KV write + split-KV + merge in one launch,
plugins/attention/_fp8_kv_decode_bs1.py). Session 15's first H100 run showed the attention's own early loads (length,
block table, its first K/V tile), which start when the rotary lets it launch, end after the rotary does: a faster
rotary (its cos / sin read early: -24 us) only moved that time into the attention (+21 us). Here the rotary kernel
goes: the attention kernel takes the unrotated q / k, rotates them as the rotary kernel does (the same FMAs, the same
bf16 rounding: the same bits), and launches as the qkv GEMV's dependent, so its early loads overlap the GEMV.

How: :func:`install` wraps, per instance, a LlamaAttention whose forward is that class's code (as fp8_rope_gemv.py
does). At one token of one request, when the layer's backend is the ``triton`` one and its one-launch rule takes the
call (``_fp8_kv_decode_bs1.one_launch``: e4m3 cache, no window / soft cap, the measured TABLE), the wrapper runs the
qkv projection, the attention kernel with ``rope=(positions, cos, sin)`` and o_proj; every other call runs the
layer's own forward. ``ON`` is read per call (graphs captured after a switch use it).
"""

from __future__ import annotations

import logging
import types

import torch

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)

# read per call by the installed wrappers; benchmarks switch it and recapture their graphs
ON = env_switch("OCTAVO_FP8_ATTN_ROPE", default=True)


def fusable(module) -> bool:
    """LlamaAttention's own forward code, full neox rotary, a paged ``Attention`` layer."""
    from octavo.plugins.models.llama import LlamaAttention

    rope, attn = getattr(module, "rotary_emb", None), getattr(module, "attn", None)
    if rope is None or attn is None or getattr(module, "qkv_proj", None) is None or getattr(module, "o_proj", None) is None:
        return False
    if not getattr(rope, "is_neox_style", False) or rope.rotary_dim != rope.head_size:
        return False
    code, ref = getattr(type(module).forward, "__code__", None), LlamaAttention.forward.__code__
    return code is not None and (code.co_code, code.co_names, code.co_consts) == (ref.co_code, ref.co_names,
                                                                               ref.co_consts)


def _launch(attn, ctx):
    """The one-launch keyword arguments when the triton backend would take this one-token call, else None."""
    from octavo.plugins.attention._fp8_kv_decode_bs1 import one_launch
    from octavo.plugins.attention.triton import TritonAttentionBackend

    impl, cache, md = attn.impl, attn.kv_cache, getattr(ctx, "attn_metadata", None)
    if not isinstance(impl, TritonAttentionBackend) or cache is None or md is None or md.num_reqs != 1:
        return None
    if attn._forward_hooks or attn._forward_pre_hooks or not (cache.is_contiguous() and cache.shape[0] == 2):
        return None
    return one_launch(cache.dtype, impl.group, impl.head_size, 1, md.num_reqs, impl.window, impl.soft_cap)


def _attend(attn, q, k, v, positions, rope, ctx, launch) -> torch.Tensor:
    from octavo.plugins.attention._fp8_kv_decode_bs1 import fp8_decode_one
    from octavo.plugins.attention.triton import _pdl_opts

    impl, cache, md = attn.impl, attn.kv_cache, ctx.attn_metadata
    heads, kv_heads, d = attn.num_heads, attn.num_kv_heads, attn.head_size
    out = torch.empty(1, heads, d, dtype=q.dtype, device=q.device)
    fp8_decode_one(q.view(1, heads, d), k.view(1, kv_heads, d), v.view(1, kv_heads, d), cache[0], cache[1],
                   md.block_tables[0], md.seq_lens, md.slot_mapping, out, scale=impl.scale * impl.k_scale,
                   k_scale=impl.k_scale, v_scale=impl.v_scale, pdl=_pdl_opts(),
                   rope=(positions.reshape(1), rope.cos_cache, rope.sin_cache), **launch)
    return out.view(1, heads * d)


def _install(module) -> None:
    inner = module.forward
    rope, attn = module.rotary_emb, module.attn

    def forward(self, positions, hidden_states, ctx):
        x = hidden_states
        if (ON and x.dim() == 2 and x.shape[0] == 1 and positions.numel() == 1 and not rope._forward_hooks
                and not rope._forward_pre_hooks):
            launch = _launch(attn, ctx)
            if launch is not None:
                q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
                return self.o_proj(_attend(attn, q, k, v, positions, rope, ctx, launch))
        return inner(positions, hidden_states, ctx)

    module.forward = types.MethodType(forward, module)
    module._octavo_fp8_attn_rope = True  # never wrapped twice


def install(model: torch.nn.Module, device: torch.device | None = None) -> int:
    """Wrap every fusable attention of ``model`` once; returns how many are wrapped."""
    n = 0
    for m in model.modules():
        if "_octavo_fp8_attn_rope" in vars(m):
            n += 1
        elif "_octavo_fp8_rope" in vars(m):  # the opt-in qkv GEMV + rotary (fp8_rope_gemv.py) asked for: it stays
            continue
        elif fusable(m):
            _install(m)
            n += 1
    logger.info("batch-1 fp8 attention with the rotary inside: %d layers wrapped (%s)", n,
                "on" if ON else "off: OCTAVO_FP8_ATTN_ROPE")
    return n
