"""Qwen3 attention's per-head q/k RMSNorm and rotary embedding in one Triton kernel.

Why: eagerly (even with the fused norm and rope kernels of ``cuda_fusions``) a Qwen3 attention block runs five
small kernels between the qkv GEMM and attention: q and k are strided column slices of the qkv output, so each
norm's ``reshape(-1, head_dim)`` first copies its slice, then normalises it, then one kernel rotates both. Here one
launch reads q and k straight out of the qkv output, normalises each head, rounds where torch rounds (the norm's
output to the model dtype, the rotation in fp32 rounded to the dtype) and writes the rotated q and k. Four fewer
launches per layer: 112 per decode step of the Qwen3-0.6B shape, ~2-3 us each inside a CUDA graph.

:func:`fuse_qk_norm_rope` installs it on ``Qwen3Attention`` modules (Qwen3 dense and MoE) whose forward is the
class's own, with plain :class:`~octavo.nn.RMSNorm` norms of the qkv dtype and a plain
:class:`~octavo.nn.rotary.RotaryEmbedding`, after checking it against the eager forward on random inputs (as
``cuda_fusions`` checks its kernels); ``OCTAVO_FUSE_QK_NORM_ROPE=0`` keeps the eager path.
"""

from __future__ import annotations

import logging
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)


@triton.jit(do_not_specialize=["stride_t", "num_q_heads", "num_k_heads"])
def _qk_norm_rope_kernel(pos_ptr, cos_ptr, sin_ptr, qkv_ptr, qw_ptr, kw_ptr, q_out_ptr, k_out_ptr, stride_t,
                         num_q_heads, num_k_heads, stride_cos, eps,
                         HEAD: tl.constexpr, ROT: tl.constexpr, HALF_P: tl.constexpr, PASS_P: tl.constexpr,
                         BLOCK_H: tl.constexpr, NEOX: tl.constexpr):
    """One program per (token, q-or-k): every head of that tensor normalised and rotated."""
    t = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        x_ptr, w_ptr, out_ptr, num_heads = qkv_ptr + t * stride_t, qw_ptr, q_out_ptr, num_q_heads
    else:
        x_ptr, w_ptr, out_ptr, num_heads = qkv_ptr + t * stride_t + num_q_heads * HEAD, kw_ptr, k_out_ptr, num_k_heads
    out_ptr = out_ptr + t * num_heads * HEAD
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, HALF_P)
    h = tl.arange(0, BLOCK_H)
    im = i < ROT // 2
    hm = h[:, None] < num_heads
    m = hm & im[None, :]
    if NEOX:
        i1, i2 = i, i + ROT // 2
    else:
        i1, i2 = 2 * i, 2 * i + 1
    x1 = tl.load(x_ptr + h[:, None] * HEAD + i1[None, :], mask=m, other=0.0)
    x2 = tl.load(x_ptr + h[:, None] * HEAD + i2[None, :], mask=m, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    ss = tl.sum(a * a, 1) + tl.sum(b * b, 1)
    if PASS_P > 0:  # partial rotary: the tail of each head is normalised, not rotated
        j = tl.arange(0, PASS_P)
        pm = hm & (j[None, :] < HEAD - ROT)
        xp = tl.load(x_ptr + h[:, None] * HEAD + ROT + j[None, :], mask=pm, other=0.0)
        c = xp.to(tl.float32)
        ss += tl.sum(c * c, 1)
    rstd = tl.rsqrt(ss / HEAD + eps)[:, None]
    # RMSNorm: the normalised value rounds to the dtype, times the weight rounds again (octavo.nn.RMSNorm)
    w1 = tl.load(w_ptr + i1, mask=im, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + i2, mask=im, other=0.0).to(tl.float32)[None, :]
    a = ((a * rstd).to(x1.dtype).to(tl.float32) * w1).to(x1.dtype).to(tl.float32)
    b = ((b * rstd).to(x1.dtype).to(tl.float32) * w2).to(x1.dtype).to(tl.float32)
    cos = tl.load(cos_ptr + pos * stride_cos + i, mask=im, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * stride_cos + i, mask=im, other=0.0).to(tl.float32)[None, :]
    base = out_ptr + h[:, None] * HEAD
    tl.store(base + i1[None, :], (a * cos - b * sin).to(x1.dtype), mask=m)
    tl.store(base + i2[None, :], (b * cos + a * sin).to(x1.dtype), mask=m)
    if PASS_P > 0:
        wp = tl.load(w_ptr + ROT + j, mask=j < HEAD - ROT, other=0.0).to(tl.float32)[None, :]
        tl.store(base + ROT + j[None, :], ((c * rstd).to(x1.dtype).to(tl.float32) * wp).to(x1.dtype), mask=pm)


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def qk_norm_rope(attn, positions: torch.Tensor, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, k)`` of a Qwen3 attention module from its qkv output ``[n, q_size + 2 * kv_size]``: each head
    RMS-normalised (``q_norm`` / ``k_norm``) and rotated (``rotary_emb``), as ``[n, q_size]`` / ``[n, kv_size]``."""
    n, head, rope = qkv.shape[0], attn.head_dim, attn.rotary_emb
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    q = torch.empty(n, attn.q_size, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(n, attn.kv_size, dtype=qkv.dtype, device=qkv.device)
    if n:
        cos, sin = rope.cos_cache, rope.sin_cache
        _qk_norm_rope_kernel[(n, 2)](
            positions, cos, sin, qkv, attn.q_norm.weight, attn.k_norm.weight, q, k, qkv.stride(0),
            attn.num_heads, attn.num_kv_heads, cos.stride(0), attn.q_norm.eps,
            HEAD=head, ROT=rope.rotary_dim, HALF_P=_p2(rope.rotary_dim // 2),
            PASS_P=_p2(head - rope.rotary_dim) if head > rope.rotary_dim else 0,
            BLOCK_H=_p2(max(attn.num_heads, attn.num_kv_heads)), NEOX=bool(rope.is_neox_style))
    return q, k


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to rounding: a normalised value that rounds the other way (the kernel sums squares in another
    order) moves a rotated output by up to ~1.5 ulp of the head's largest input, however small the output
    itself, so the absolute slack scales with the tensor's RMS: 6 x one rounding step of the dtype."""
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}.get(want.dtype, 1e-5)
    g, w = got.float(), want.float()
    scale = w.pow(2).mean().sqrt().clamp_min(1.0)
    return bool(((g - w).abs() <= tol * w.abs() + 6 * tol * scale).all())


def _fused_forward(self, positions, hidden_states, ctx):
    qkv = self.qkv_proj(hidden_states)
    q, k = qk_norm_rope(self, positions, qkv)
    v = qkv[:, self.q_size + self.kv_size:]
    return self.o_proj(self.attn(q, k, v, ctx))


def _eligible(m, attn_cls, rms_cls, rope_cls) -> bool:
    if type(m).forward is not attn_cls.forward:
        return False
    qn, kn = m.q_norm, m.k_norm
    return (type(qn) is rms_cls and type(kn) is rms_cls and type(m.rotary_emb) is rope_cls and qn.eps == kn.eps
            and qn.weight.shape[0] == kn.weight.shape[0] == m.head_dim and m.rotary_emb.head_size == m.head_dim)


@torch.inference_mode()
def _verify(m, dtype, device, gen) -> bool:
    """The fused q and k against the module's own norms and rotary on random inputs of the model dtype."""
    n = 7
    qkv = torch.randn(n, m.q_size + 2 * m.kv_size, generator=gen, device=device).to(dtype)
    pos = torch.randint(0, m.rotary_emb.cos_cache.shape[0], (n,), generator=gen, device=device)
    try:
        q, k, _ = qkv.split([m.q_size, m.kv_size, m.kv_size], dim=-1)
        q = m.q_norm(q.reshape(n, m.num_heads, m.head_dim)).reshape(n, m.q_size)
        k = m.k_norm(k.reshape(n, m.num_kv_heads, m.head_dim)).reshape(n, m.kv_size)
        want = m.rotary_emb(pos, q, k)
        got = qk_norm_rope(m, pos, qkv)
    except Exception as e:  # noqa: BLE001 - a shape the kernel does not handle: keep eager
        logger.warning("fused q/k norm + rope not used: %s", e)
        return False
    ok = all(g.shape == w.shape and g.dtype == w.dtype and close(g, w) for g, w in zip(got, want))
    if not ok:
        logger.warning("fused q/k norm + rope not used: it disagrees with the eager forward")
    return ok


def fuse_qk_norm_rope(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> dict[str, int]:
    """Install the fused q/k norm + rope forward on eligible Qwen3 attention modules; returns the count."""
    if not env_switch("OCTAVO_FUSE_QK_NORM_ROPE"):
        return {}
    from octavo.nn.layernorm import RMSNorm
    from octavo.nn.rotary import RotaryEmbedding
    from octavo.plugins.models.qwen3 import Qwen3Attention

    count, verified = 0, {}
    gen = torch.Generator(device=device).manual_seed(0)
    for m in model.modules():
        if not isinstance(m, Qwen3Attention) or not _eligible(m, Qwen3Attention, RMSNorm, RotaryEmbedding):
            continue
        if m.q_norm.weight.dtype != dtype or m.k_norm.weight.dtype != dtype:
            continue
        rope = m.rotary_emb
        key = (m.num_heads, m.num_kv_heads, m.head_dim, rope.rotary_dim, rope.is_neox_style, id(rope.cos_cache))
        if key not in verified:
            verified[key] = _verify(m, dtype, device, gen)
        if verified[key]:
            m.forward = types.MethodType(_fused_forward, m)
            count += 1
    return {"QKNormRope": count} if count else {}
