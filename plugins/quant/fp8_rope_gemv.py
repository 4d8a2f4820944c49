"""The fp8 qkv GEMV with Llama's rotary embedding in its epilogue, for batch-1 decode (opt-in:
``OCTAVO_FP8_ROPE_GEMV=1``; session 11, measured in benchmarks/fp8_bs1.py's ``rope`` variant).

Why: at one row a Llama attention block is the qkv GEMV, a rotary kernel (~2 us a layer on H100, more under PDL
where it waits for the GEMV) and the attention; a kernel boundary per layer costs the GEMV's drain and the next
kernel's ramp (issue 9's strict batch-1 key: ~23 us a layer above the weights' streaming time, docs/performance.md
"FP8 session 11"). Here the GEMV rotates what it computes, so the rotary launch goes.

How: neox rotary pairs output ``c`` of a head with ``c + D/2``; each program's tile holds ``BLOCK_N / 2`` such pairs
(first half of its rows the ``c`` rows of the e4m3 weight, second half the ``c + D/2`` rows) and runs fp8_gemv.py's
one-row body on them (fp8_silu_gemv._pair_gemv: the same loads, accumulator and rounding) with the unfused qkv
GEMV's tuned tile, so every output has that GEMV's bits; then, for the q and k columns, the rotary kernel's
expressions (``a * cos - b * sin``, ``b * cos + a * sin`` in fp32, rounded) at the row's position; v columns are
stored as computed. Installed per attention whose forward is LlamaAttention's code, full neox rotary, an fp8 qkv
without bias on the CUDA-core one-row GEMV, after a check against the unfused GEMV + rotary on random rows (own and
producer quantization).
"""

from __future__ import annotations

import logging
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.quant.fp8_silu_gemv import (
    _halves,
    _kernel_args,
    _launch,
    _pair_gemv,
    _settings,
    fuse_each,
)

logger = logging.getLogger(__name__)
STATE = {"on": env_switch("OCTAVO_FP8_ROPE_GEMV", default=False)}  # installed wrappers read it per call


@triton.jit
def _fp8_gemv_rope_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, pos_ptr, cos_ptr, sin_ptr, stride_cos, N, N_ROT, K,
                          stride_wn, QUANT_X: tl.constexpr, PRE_Q: tl.constexpr, EVEN: tl.constexpr,
                          SOFT_FP8: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          USE_PDL: tl.constexpr = False, PDL_W: tl.constexpr = False, ACC_SPLIT: tl.constexpr = 0,
                          X2D: tl.constexpr = False):
    """Program ``p`` owns the rotary pairs ``[p * BLOCK_N / 2, (p + 1) * BLOCK_N / 2)``: its tile's first half of rows
    are their columns ``c``, the second half ``c + D/2`` (one accumulator over both: with the qkv GEMV's tile every
    output has that GEMV's bits), then the rotary kernel's expressions."""
    r = tl.arange(0, BLOCK_N)
    j = tl.program_id(0) * (BLOCK_N // 2) + (r % (BLOCK_N // 2))  # pair index over the N / 2 pairs
    n = (j // HALF) * (2 * HALF) + (j % HALF) + tl.where(r >= BLOCK_N // 2, HALF, 0)
    a, b = _halves(_pair_gemv(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, n, j < N // 2, K, stride_wn, QUANT_X, PRE_Q,
                              EVEN, SOFT_FP8, BLOCK_N, BLOCK_K, USE_PDL, PDL_W, ACC_SPLIT, X2D), BLOCK_N)
    jj = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    jm = jj < N // 2
    off = jj % HALF
    n1 = (jj // HALF) * (2 * HALF) + off
    rot = jm & (n1 < N_ROT)
    pos = tl.load(pos_ptr).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_cos + off, mask=rot, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_cos + off, mask=rot, other=0.0)
    o1 = tl.where(rot, a * cos - b * sin, a)  # the rotary kernel's expressions (cuda_fusions._rope_kernel)
    o2 = tl.where(rot, b * cos + a * sin, b)
    elt = y_ptr.dtype.element_ty
    tl.store(y_ptr + n1, o1.to(elt), mask=jm)
    tl.store(y_ptr + n1 + HALF, o2.to(elt), mask=jm)


def fp8_gemv_rope(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, positions: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, head: int, rot_cols: int, x_scale: torch.Tensor | None = None,
                  out_dtype: torch.dtype = torch.bfloat16, config: tuple[int, ...] | None = None, *,
                  pdl: bool = False, pdl_w: bool = False, acc_split: int | None = None) -> torch.Tensor:
    """``x [1, K]`` (bf16, or e4m3 with ``x_scale``) times the e4m3 ``weight [N, K]`` (per-row ``weight_scale``),
    the first ``rot_cols`` outputs rotated (neox, heads of ``head``) at ``positions[0]`` with ``cos`` / ``sin``
    ``[max_pos, head / 2]``; ``[1, N]``. ``config = (BLOCK_N, BLOCK_K, num_warps[, num_stages])``; None: the
    unfused GEMV's tuned tile for this weight (so the same bits as the GEMV + the rotary kernel)."""
    n, k = weight.shape
    if x.shape != (1, k) or weight.stride(1) != 1 or n % head or head % 2 or rot_cols % head:
        raise ValueError(f"fp8_gemv_rope: x {tuple(x.shape)}, weight {tuple(weight.shape)}, head {head}, "
                         f"rotated {rot_cols}: one row, [N, K] row-major, whole heads")
    if (x_scale is not None) != (x.dtype == torch.float8_e4m3fn):
        raise ValueError("fp8_gemv_rope: an e4m3 x comes with its x_scale, a 16-bit x without")
    if cos.shape[-1] != head // 2 or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"fp8_gemv_rope: cos/sin {tuple(cos.shape)} must be [positions, {head // 2}], row-major")
    x = x.contiguous()
    acc_split, soft, config = _settings("fp8_gemv_rope", x, weight, weight_scale, x_scale, out_dtype, n // 2, config,
                                        pdl, pdl_w, acc_split)
    y = torch.empty(1, n, dtype=out_dtype, device=x.device)
    ws = weight_scale.reshape(-1)
    bn, bk = config[:2]
    if bn % 2:
        raise ValueError(f"fp8_gemv_rope: BLOCK_N {bn} must be even (pairs)")
    even = not soft and k % bk == 0 and (n // 2) % (bn // 2) == 0
    _fp8_gemv_rope_kernel[(triton.cdiv(n // 2, bn // 2),)](
        x, x_scale.reshape(-1) if x_scale is not None else ws, weight, ws, y, positions, cos, sin, cos.stride(0),
        n, rot_cols, k, weight.stride(0), HALF=head // 2, **_kernel_args(config, x_scale, soft, even, pdl, pdl_w,
                                                                         acc_split))
    return y


def _fusable(module) -> bool:
    """LlamaAttention's forward (its class or a copy of its code), full neox rotary, an fp8 qkv without bias on the
    CUDA-core one-row GEMV."""
    from octavo.plugins.models.llama import LlamaAttention
    from octavo.plugins.quant.fp8 import _FP8Method

    qkv, rope = getattr(module, "qkv_proj", None), getattr(module, "rotary_emb", None)
    qm = getattr(qkv, "quant_method", None)
    if (not isinstance(qm, _FP8Method) or getattr(qm, "gemv_tc", None) is not None or not getattr(qm, "gemv_max_m", 0)
            or getattr(qkv, "bias", None) is not None or qkv.weight.stride(1) != 1 or rope is None
            or not getattr(rope, "is_neox_style", False) or rope.rotary_dim != rope.head_size
            or getattr(module, "o_proj", None) is None or getattr(module, "attn", None) is None):
        return False
    if qkv.weight.shape[0] != module.q_size + 2 * module.kv_size or module.q_size % rope.head_size:
        return False
    code, ref = getattr(type(module).forward, "__code__", None), LlamaAttention.forward.__code__
    return code is not None and (code.co_code, code.co_names, code.co_consts) == (ref.co_code, ref.co_names,
                                                                               ref.co_consts)


def _call(module, x, positions, pre=None):
    qkv, rope = module.qkv_proj, module.rotary_emb
    launch = _launch(qkv, x.device)
    args = (qkv.weight, qkv.weight_scale, positions, rope.cos_cache, rope.sin_cache, rope.head_size,
            module.q_size + module.kv_size)
    if pre is not None:
        return fp8_gemv_rope(pre[0], *args, x_scale=pre[1], out_dtype=x.dtype, **launch)
    return fp8_gemv_rope(x, *args, out_dtype=x.dtype, **launch)


def _install(module) -> None:
    inner = module.forward
    qkv, rope = module.qkv_proj, module.rotary_emb

    def forward(self, positions, hidden_states, ctx):
        x = hidden_states
        if (_on() and x.dim() == 2 and x.shape[0] == 1 and positions.numel() == 1 and not qkv._forward_hooks
                and not qkv._forward_pre_hooks and not rope._forward_hooks and not rope._forward_pre_hooks):
            pre = getattr(x, "_octavo_fp8", None)  # quantized by the norm that made x (fp8_fused.py)
            ok = pre is not None and pre[0].shape == x.shape and getattr(qkv.quant_method, "gemv_pre_ok", False)
            y = _call(self, x, positions, pre if ok else None)
            q, k, v = y.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            return self.o_proj(self.attn(q, k, v, ctx))
        return inner(positions, hidden_states, ctx)

    module.forward = types.MethodType(forward, module)
    module._octavo_fp8_rope = True  # never wrapped twice


def _on() -> bool:
    return STATE["on"]


@torch.inference_mode()
def fuse_fp8_rope_gemv(model: torch.nn.Module, device: torch.device) -> int:
    """Wrap every fusable attention of ``model`` (the kernel checked once per shape against the unfused GEMV +
    rotary, own and producer quantization, within one bf16 rounding); returns how many."""
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    gen = torch.Generator(device=device).manual_seed(1)

    def shape_key(module):
        return (tuple(module.qkv_proj.weight.shape), module.q_size, module.kv_size, module.rotary_emb.head_size)

    def check(module, key):
        qkv, rope = module.qkv_proj, module.rotary_emb
        x = torch.randn(1, key[0][1], generator=gen, device=device).bfloat16()
        pos = torch.tensor([777 % rope.cos_cache.shape[0]], device=device)
        q, k, v = qkv(x).split([module.q_size, module.kv_size, module.kv_size], dim=-1)
        q, k = rope(pos, q, k)
        want = torch.cat([q.reshape(1, -1), k.reshape(1, -1), v.reshape(1, -1)], -1).float()
        xq, xs = quantize_per_token(x)
        worst = max(float((got.float() - want).abs().max()) for got in (
            _call(module, x, pos), _call(module, x, pos, (xq, xs))))
        return worst, float(want.abs().max())

    return fuse_each(model, "_octavo_fp8_rope", _fusable, shape_key, check, _install, "fp8 qkv + rotary GEMV", logger)
