"""Batch-1 SiLU-and-mul that also hands down_proj its row's absmax in pieces (session 16, engineer fp816; with the TMA
GEMV, ``OCTAVO_FP8_GEMV_TMA_AMAX``, opt-in until measured).

Why: at one row down_proj quantizes its own input (fp8_gemv's ``AMAX_KP``): after its PDL wait every program reads the
whole 14,336-wide row (one L2 round trip) and reduces it before any weight math, and in the TMA GEMV
(fp8_gemv_tma.py) before its first copy is issued. The SiLU kernel in front already holds the row: each of its
programs stores the max of ``|out|`` over its columns (a plain store into its own slot: no atomic, nothing to reset),
and the GEMV takes the max of those few values (one small load, in flight together with the copies). Max is exact in
any order, so the scale, and every bit after it, is the in-kernel absmax's.

The kernel is plugins/platforms/cuda_fusions.py's ``_silu_and_mul_kernel`` (the same expressions, launch grid, block
and PDL) plus that store; ``silu_and_mul_amax`` returns ``(out, amax [rows, parts])``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts
from octavo.plugins.platforms.cuda_silu_tile import silu_mul_tile


@triton.jit
def _silu_mul_amax_kernel(x_ptr, out_ptr, amax_ptr, stride_x, d, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row, cols, mask, o = silu_mul_tile(x_ptr, stride_x, d, BLOCK)
    tl.store(out_ptr + row * d + cols, o, mask=mask)
    part = tl.max(tl.where(mask, tl.abs(o.to(tl.float32)), 0.0), 0)
    tl.store(amax_ptr + row * tl.num_programs(1) + tl.program_id(1), part)


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def silu_and_mul_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(silu(x[..., :d]) * x[..., d:], amax [rows, parts])``: cuda_fusions.silu_and_mul's output bits and each
    program's max of ``|out|`` over its ``min(2048, d)`` columns."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    block = min(2048, _p2(d))
    parts = triton.cdiv(d, block)
    out = torch.empty(rows, d, dtype=x.dtype, device=x.device)
    amax = torch.empty(rows, parts, dtype=torch.float32, device=x.device)
    if rows:
        _silu_mul_amax_kernel[(rows, parts)](x2, out, amax, x2.stride(0), d, BLOCK=block, **launch_opts())
    return out.view(*x.shape[:-1], d), amax
