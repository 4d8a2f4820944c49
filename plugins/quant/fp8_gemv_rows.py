"""The fp8 GEMV for 2-16 rows (plugins/quant/fp8_gemv.py's ``fp8_gemv`` launches it for ``m > 1``): each weight tile
is loaded once and applied to every row. On H100 it measured slower than ``torch._scaled_mm`` from 2 rows on and two
of its GPU checks failed undiagnosed (session 5), so the engine only uses the one-row kernel; this one stays for
experiments and its interpreter test (tests/quant/test_fp8_gemv.py). Kept apart so fp8_gemv.py holds the one-row
kernel the engine runs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.quant.fp8_e4m3 import _round_e4m3


@triton.jit
def _fp8_gemv_rows_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                          QUANT_X: tl.constexpr, PRE_Q: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                          SOFT_FP8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    """The same product for 2..BLOCK_M rows: each weight tile is loaded once and applied to every row
    (a [BLOCK_M, BLOCK_N, BLOCK_K] fp32 accumulator) instead of once per row."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    r = tl.arange(0, BLOCK_M)
    rm = r < M
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + r[:, None] * stride_xm
    ws = tl.load(ws_ptr + n, mask=nm, other=0.0)
    s_x = tl.full([BLOCK_M], 1.0, tl.float32)
    if PRE_Q:
        s_x = tl.load(xs_ptr + r, mask=rm, other=1.0)
    if QUANT_X:
        amax = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            kk = k + tl.arange(0, BLOCK_K)
            v = tl.load(x_rows + kk[None, :], mask=rm[:, None] & (kk[None, :] < K), other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        s_x = tl.maximum(tl.math.div_rn(tl.max(amax, axis=1), 448.0), 1e-12)
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(rows + kk[None, :])
        else:
            w = tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
        x = tl.load(x_rows + kk[None, :], mask=rm[:, None] & (kk[None, :] < K), other=0.0).to(tl.float32)
        if QUANT_X:
            x = tl.minimum(tl.maximum(tl.math.div_rn(x, s_x[:, None]), -448.0), 448.0)
            if SOFT_FP8:
                x = _round_e4m3(x)
            else:
                x = x.to(tl.float8e4nv).to(tl.float32)
        acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
    y = (tl.sum(acc, 2) * s_x[:, None] * ws[None, :]).to(y_ptr.dtype.element_ty)
    if HAS_BIAS:
        y = (y.to(tl.float32) + tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]).to(y.dtype)
    tl.store(y_ptr + r[:, None] * stride_ym + n[None, :], y, mask=rm[:, None] & nm[None, :])


# rows (padded to a power of two) -> (BLOCK_N, BLOCK_K, num_warps): BLOCK_M * BLOCK_N * BLOCK_K = 8192 fp32
# accumulators, 64 registers a thread at 4 warps
_ROWS_CONFIGS = {2: (16, 256, 4), 4: (16, 128, 4), 8: (8, 128, 4), 16: (8, 64, 4)}
ROWS_MAX = 16


def launch_rows(args: tuple, flags: dict, m: int, n: int, k: int, soft: bool) -> None:
    """Launch the several-rows kernel: ``args`` = (x, xs, w, ws, b, y, M, N, K, stride_xm, stride_wn, stride_ym),
    ``flags`` = QUANT_X / PRE_Q / HAS_BIAS as fp8_gemv computed them."""
    if m > ROWS_MAX:
        raise ValueError(f"fp8_gemv: {m} rows; at most {ROWS_MAX} (use torch._scaled_mm above)")
    bm = 1 << (m - 1).bit_length()
    bn, bk, warps = _ROWS_CONFIGS[bm]
    _fp8_gemv_rows_kernel[(triton.cdiv(n, bn),)](*args, **flags, EVEN=k % bk == 0 and n % bn == 0, SOFT_FP8=soft,
                                                 BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
