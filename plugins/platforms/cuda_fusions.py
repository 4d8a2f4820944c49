"""Fused GPU kernels for the small per-layer ops of a decode step, swapped into a loaded model.

At batch 1 an 8B decode step is weight-bandwidth bound (~5 ms of GEMV), and every extra elementwise
kernel costs 2-3 us; the eager ``octavo.nn`` layers launch ~35 kernels per layer for RMSNorm, rotary and
SiLU-and-mul. :func:`fuse_model` replaces, on each module instance, ``forward`` of

    RMSNorm (with or without the residual add)  -> one Triton kernel per call
    RotaryEmbedding (neox or interleaved, partial) -> one kernel for q and k together
    SiluAndMul                                   -> one kernel

and gives dense linear layers a linear method whose single-row (batch-1) path is a Triton GEMV autotuned
per weight shape (``cuda_gemv.py``; ``OCTAVO_TRITON_GEMV=0`` keeps cuBLAS). Norms and SiLU-and-muls that feed fp8 linear
layers then learn to write the quantized input too (plugins/quant/fp8_fused.py, armed here).

Each replacement is checked once against the module's own forward on random inputs of the model's dtype
(bit-for-bit rounding steps are kept: fp32 math, rounding to the model dtype where torch rounds) and only
installed if it matches; otherwise the eager forward stays and a warning says why.
"""

from __future__ import annotations

import logging
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_int
from octavo.plugins.platforms.cuda_gemv import (  # noqa: F401 - re-exported: other plugins and tests name them here
    _gemv_autotuned,
    _gemv_kernel,
    _gemv_linear_method,
    gemv,
)
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts

logger = logging.getLogger(__name__)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, n_cols, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # cuda_pdl.py (OCTAVO_PDL=1): wait for the producer of x / res, then let the consumer launch
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # torch rounds the sum to the dtype
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    y = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, d, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    u = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * d + cols, (s * u.to(tl.float32)).to(g.dtype), mask=mask)


@triton.jit(do_not_specialize=["stride_qt", "stride_kt", "num_q_heads", "num_k_heads"])  # same types
def _rope_kernel(pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, stride_qt, stride_kt,
                 num_q_heads, num_k_heads, stride_cos,
                 HEAD: tl.constexpr, ROT: tl.constexpr, HALF_P: tl.constexpr, PASS_P: tl.constexpr,
                 BLOCK_H: tl.constexpr, NEOX: tl.constexpr, PDL: tl.constexpr = False, EARLY: tl.constexpr = 0):
    """One program per (token, q-or-k): both rotations in one launch (grid axis 1 picks the tensor). ``EARLY`` (same
    bits): 1 reads position and cos / sin (host input, constants) before the PDL wait; 2 also triggers before it."""
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, HALF_P)
    im = i < ROT // 2
    if EARLY:
        pos = tl.load(pos_ptr + t).to(tl.int64)
        cos = tl.load(cos_ptr + pos * stride_cos + i, mask=im, other=0.0)[None, :]
        sin = tl.load(sin_ptr + pos * stride_cos + i, mask=im, other=0.0)[None, :]
    if PDL:
        if EARLY == 2:
            gdc_launch_dependents()
        gdc_wait()
        if EARLY != 2:
            gdc_launch_dependents()
    if tl.program_id(1) == 0:
        x_ptr, out_ptr, stride_xt, num_heads = q_ptr, q_out_ptr, stride_qt, num_q_heads
    else:
        x_ptr, out_ptr, stride_xt, num_heads = k_ptr, k_out_ptr, stride_kt, num_k_heads
    h = tl.arange(0, BLOCK_H)
    if not EARLY:
        pos = tl.load(pos_ptr + t).to(tl.int64)
        cos = tl.load(cos_ptr + pos * stride_cos + i, mask=im, other=0.0)[None, :]
        sin = tl.load(sin_ptr + pos * stride_cos + i, mask=im, other=0.0)[None, :]
    m = (h[:, None] < num_heads) & im[None, :]
    base_in = x_ptr + t * stride_xt + h[:, None] * HEAD
    base_out = out_ptr + t * num_heads * HEAD + h[:, None] * HEAD
    if NEOX:
        i1, i2 = i[None, :], i[None, :] + ROT // 2
    else:
        i1, i2 = 2 * i[None, :], 2 * i[None, :] + 1
    x1 = tl.load(base_in + i1, mask=m, other=0.0)
    x2 = tl.load(base_in + i2, mask=m, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base_out + i1, (a * cos - b * sin).to(x1.dtype), mask=m)
    tl.store(base_out + i2, (b * cos + a * sin).to(x1.dtype), mask=m)
    if PASS_P > 0:  # partial rotary: the tail of each head passes through
        j = tl.arange(0, PASS_P)
        pm = (h[:, None] < num_heads) & (j[None, :] < HEAD - ROT)
        tl.store(base_out + ROT + j[None, :], tl.load(base_in + ROT + j[None, :], mask=pm), mask=pm)


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _small_rows_norm_warps() -> int:
    import os

    raw = os.environ.get("OCTAVO_NORM_SMALL_ROWS_WARPS", "").strip()
    if raw in ("", "0"):
        return 0
    if raw not in ("2", "4", "8", "16"):
        raise ValueError(f"OCTAVO_NORM_SMALL_ROWS_WARPS={raw!r}: 2, 4, 8 or 16 warps (0 or unset: 4, 8 above 4096 wide)")
    return int(raw)


# warps of the RMSNorm kernels at <= 4 rows (batch-1 decode), this one's and cuda_allreduce_fusion's (which must
# reduce over the same layout to stay bitwise equal to it): 0 = the rule below. fp8's quantizing norm measured
# 4 -> 16 warps at one row faster on H100 (docs/performance.md "FP8 session 6"); for these, opt-in until measured
_NORM_WARPS = {"small_rows": _small_rows_norm_warps()}


def set_small_rows_norm_warps(n: int) -> None:
    """RMSNorm warps at <= 4 rows for kernels launched (or graphs captured) from now on; 0 = the default rule."""
    if n not in (0, 2, 4, 8, 16):
        raise ValueError(f"small-rows norm warps: 0 (the rule), 2, 4, 8 or 16, not {n!r}")
    _NORM_WARPS["small_rows"] = n


def norm_warps(rows: int, d: int) -> int:
    """``num_warps`` of a ``[rows, d]`` RMSNorm launch (plain or fused with the all-reduce: the same layout)."""
    if rows <= 4 and _NORM_WARPS["small_rows"]:
        return _NORM_WARPS["small_rows"]
    return 8 if d > 4096 else 4


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``weight * norm(x [+ residual])`` like ``octavo.nn.RMSNorm``; returns ``(out, new_residual)`` with one."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x2) if residual is not None else out
    r2 = residual.reshape(-1, d) if residual is not None else x2
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, out, res_out, x2.stride(0), r2.stride(0), d, eps,
                                         HAS_RES=residual is not None, BLOCK=_p2(d), num_warps=norm_warps(x2.shape[0], d),
                                         **launch_opts())
    out = out.view(x.shape)
    return out if residual is None else (out, res_out.view(x.shape))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(2048, _p2(d))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](x2, out, x2.stride(0), d, BLOCK=block,
                                                                    **launch_opts())
    return out.view(*x.shape[:-1], d)


# rotary's EARLY, ``OCTAVO_ROPE_EARLY`` 0-2 (session 15, fp815: opt-in until measured on a GPU; tests/kernels/test_rope_early.py)
ROPE_EARLY = env_int("OCTAVO_ROPE_EARLY", 0, 0, 2)


def rotary(rope, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
    """Rotate every head of ``query [n, hq * d]`` and ``key [n, hk * d]`` at ``positions`` (one launch)."""
    n, head = query.shape[0], rope.head_size
    hq, hk = query.shape[-1] // head, key.shape[-1] // head
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1:
        key = key.contiguous()
    q_out = torch.empty(n, hq * head, dtype=query.dtype, device=query.device)
    k_out = torch.empty(n, hk * head, dtype=key.dtype, device=key.device)
    if n:
        cos, sin = rope.cos_cache, rope.sin_cache
        _rope_kernel[(n, 2)](positions, cos, sin, query, key, q_out, k_out, query.stride(0), key.stride(0),
                             hq, hk, cos.stride(0), HEAD=head, ROT=rope.rotary_dim,
                             HALF_P=_p2(rope.rotary_dim // 2),
                             PASS_P=_p2(head - rope.rotary_dim) if head > rope.rotary_dim else 0,
                             BLOCK_H=_p2(max(hq, hk)), NEOX=bool(rope.is_neox_style), EARLY=ROPE_EARLY,
                             **launch_opts())
    return q_out.view(query.shape), k_out.view(key.shape)


def _fused_rms_forward(self, x, residual=None):
    return rms_norm(x, self.weight, self.eps, residual)


def _fused_silu_forward(self, x):
    return silu_and_mul(x)


def _fused_rope_forward(self, positions, query, key):
    return rotary(self, positions, query, key)


def _close(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_close(x, y) for x, y in zip(a, b))
    # allow one rounding step of the dtype (reduction order differs from torch's)
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}.get(a.dtype, 1e-5)
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.allclose(a.float(), b.float(), rtol=tol,
                                                                              atol=tol))


@torch.inference_mode()
def _check(module, fused, args) -> bool:
    try:
        want = module.forward(*args)
        got = fused(module, *args)
    except Exception as e:  # a layer shape the kernel does not handle: keep eager
        logger.warning("fused %s not used: %s", type(module).__name__, e)
        return False
    ok = _close(got, want)
    if not ok:
        logger.warning("fused %s not used: it disagrees with the eager forward", type(module).__name__)
    return ok


def fuse_model(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> dict[str, int]:
    """Install the fused forwards on ``model``'s RMSNorm, RotaryEmbedding and SiluAndMul modules.

    Returns how many modules of each kind now run fused. Modules of other types are left alone.
    """
    from octavo.env_flags import env_switch
    from octavo.nn.activation import SiluAndMul
    from octavo.nn.layernorm import RMSNorm
    from octavo.nn.linear import LinearBase, UnquantizedLinearMethod
    from octavo.nn.rotary import RotaryEmbedding

    counts = {"RMSNorm": 0, "RotaryEmbedding": 0, "SiluAndMul": 0, "Linear(gemv)": 0}
    # 1/0 only: any other value was silently read as 1 (on)
    use_gemv = env_switch("OCTAVO_TRITON_GEMV", True) and dtype in (torch.float16, torch.bfloat16)
    verified: dict[tuple, bool] = {}
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    for module in model.modules():
        kind = type(module)
        if isinstance(module, LinearBase) and use_gemv and type(module.quant_method) is UnquantizedLinearMethod:
            key = ("gemv", tuple(module.weight.shape), module.bias is not None)
            if key not in verified:
                method = _gemv_linear_method()
                x = rnd(1, module.weight.shape[1])
                try:
                    verified[key] = _close(method.apply(module, x, module.bias),
                                           UnquantizedLinearMethod().apply(module, x, module.bias))
                except Exception as e:  # noqa: BLE001 - keep cuBLAS for a shape the kernel rejects
                    logger.warning("gemv not used for %s: %s", tuple(module.weight.shape), e)
                    verified[key] = False
            if verified[key]:
                module.quant_method = _gemv_linear_method()
                counts["Linear(gemv)"] += 1
            continue
        if kind is RMSNorm:
            d = module.weight.shape[0]
            key = (kind, d, module.weight.dtype)
            if key not in verified:
                verified[key] = (_check(module, _fused_rms_forward, (rnd(5, d),))
                                 and _check(module, _fused_rms_forward, (rnd(5, d), rnd(5, d))))
            fused = _fused_rms_forward
        elif kind is RotaryEmbedding:
            hd = module.head_size
            key = (kind, hd, module.rotary_dim, module.is_neox_style, id(module.cos_cache))
            if key not in verified:
                pos = torch.randint(0, module.cos_cache.shape[0], (7,), generator=gen, device=device)
                verified[key] = _check(module, _fused_rope_forward, (pos, rnd(7, 4 * hd), rnd(7, 2 * hd)))
            fused = _fused_rope_forward
        elif kind is SiluAndMul:
            key = (kind,)
            if key not in verified:
                verified[key] = _check(module, _fused_silu_forward, (rnd(3, 2 * 1000),))
            fused = _fused_silu_forward
        else:
            continue
        if verified[key]:
            module.forward = types.MethodType(fused, module)
            counts[kind.__name__] += 1
    # Qwen3 attention: per-head q/k norms + rotary in one kernel (plugins/platforms/cuda_qk_norm_rope.py)
    from octavo.plugins.platforms.cuda_qk_norm_rope import fuse_qk_norm_rope

    counts.update(fuse_qk_norm_rope(model, dtype, device))
    # Llama MLPs: gate/up GEMV + SiLU-and-mul in one kernel at batch 1 (cuda_mlp_fusion.py; OCTAVO_FUSE_SILU_GEMV=1)
    from octavo.plugins.platforms.cuda_mlp_fusion import fuse_silu_gemv

    counts.update(fuse_silu_gemv(model, dtype, device, _close))
    # dense LM heads cuda_gemm.LOGITS_TABLE lists: float32 logits in one pass, no copy kernel (OCTAVO_TRITON_GEMM=0 off)
    from octavo.plugins.platforms.cuda_gemm import install_logits

    counts.update(install_logits(model))
    # norms / SiLU-and-muls feeding fp8 linears learn to write the quantized input too
    from octavo.plugins.quant.fp8_fused import link_fp8_inputs

    counts.update(link_fp8_inputs(model))
    logger.info("Fused GPU kernels installed: %s", counts)
    return counts
