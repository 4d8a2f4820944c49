"""Batch-1 o_proj of the MoE models' one-launch attention: a GEMV whose programs load up to 8 K-blocks of their
weight rows before the PDL wait, so the weight streams while the attention still runs.

Why: in the session-8 profile of Qwen3-30B-A3B at batch 1 (H100) the one-launch attention takes ~7.7 us a layer
for 1.3 MB of KV, on 64 programs (4 kv heads x 16 splits): HBM idles and most SMs are free. The o_proj GEMV after
it (16.8 MB, ~5.5 us at the copy rate) already starts early under PDL, but ``cuda_fusions._gemv_kernel`` loads
only its first tile before its wait. Here each program holds ``PRE`` blocks (``[BLOCK_N, BLOCK_K]`` each) in
registers across the wait: with 8 x 512 tiles at 4 warps and PRE 8 (all of K = 4096), the 256 programs (2 per SM)
have the whole weight in flight before the attention ends. The weight never changes, so loading it before the
wait is what ``cuda_pdl`` allows.

The sums are ``_gemv_kernel``'s in the same order for the same tile (block by block into a ``[BLOCK_N, BLOCK_K]``
fp32 accumulator, then a row sum), so with the engine GEMV's tile the bits are the same. Opt-in through the
one-launch attention's settings (``moe_attention``: ``o_early``); docs/moe.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts

MAX_PRE = 8


@triton.jit
def _w_block(rows, nm, K, kb, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    if EVEN:  # no masks: fewer registers held across the wait (the same values)
        return tl.load(rows + kk[None, :])
    return tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)


@triton.jit
def _fma(acc, w, x_ptr, K, kb, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    if EVEN:
        x = tl.load(x_ptr + kk)
    else:
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
    return acc + w.to(tl.float32) * x.to(tl.float32)[None, :]


@triton.jit
def _gemv_early_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PRE: tl.constexpr, EVEN: tl.constexpr = False, PDL: tl.constexpr = False):
    """``y[n] = sum_k x[k] W[n, k]`` for one row; the first ``PRE`` (>= 1) K-blocks of W load before the wait.
    ``EVEN``: the tile divides N and K (and PRE <= K's blocks), so no load needs a mask."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    w0 = _w_block(rows, nm, K, 0, BLOCK_K, EVEN)  # static ifs: the names stay in scope after them
    if PRE > 1:
        w1 = _w_block(rows, nm, K, 1, BLOCK_K, EVEN)
    if PRE > 2:
        w2 = _w_block(rows, nm, K, 2, BLOCK_K, EVEN)
    if PRE > 3:
        w3 = _w_block(rows, nm, K, 3, BLOCK_K, EVEN)
    if PRE > 4:
        w4 = _w_block(rows, nm, K, 4, BLOCK_K, EVEN)
    if PRE > 5:
        w5 = _w_block(rows, nm, K, 5, BLOCK_K, EVEN)
    if PRE > 6:
        w6 = _w_block(rows, nm, K, 6, BLOCK_K, EVEN)
    if PRE > 7:
        w7 = _w_block(rows, nm, K, 7, BLOCK_K, EVEN)
    if PDL:  # x comes from the attention
        gdc_wait()
        gdc_launch_dependents()
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc = _fma(acc, w0, x_ptr, K, 0, BLOCK_K, EVEN)
    if PRE > 1:
        acc = _fma(acc, w1, x_ptr, K, 1, BLOCK_K, EVEN)
    if PRE > 2:
        acc = _fma(acc, w2, x_ptr, K, 2, BLOCK_K, EVEN)
    if PRE > 3:
        acc = _fma(acc, w3, x_ptr, K, 3, BLOCK_K, EVEN)
    if PRE > 4:
        acc = _fma(acc, w4, x_ptr, K, 4, BLOCK_K, EVEN)
    if PRE > 5:
        acc = _fma(acc, w5, x_ptr, K, 5, BLOCK_K, EVEN)
    if PRE > 6:
        acc = _fma(acc, w6, x_ptr, K, 6, BLOCK_K, EVEN)
    if PRE > 7:
        acc = _fma(acc, w7, x_ptr, K, 7, BLOCK_K, EVEN)
    for kb in range(PRE, tl.cdiv(K, BLOCK_K)):
        acc = _fma(acc, _w_block(rows, nm, K, kb, BLOCK_K, EVEN), x_ptr, K, kb, BLOCK_K, EVEN)
    tl.store(y_ptr + n, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=nm)


def gemv_early(x: torch.Tensor, weight: torch.Tensor, pre: int, block_n: int = 8, block_k: int = 512,
               num_warps: int = 4) -> torch.Tensor:
    """``F.linear(x, weight)`` for one row ``x [1, K]`` (bias-free, row-major ``weight [N, K]``)."""
    if isinstance(pre, bool) or not isinstance(pre, int) or not 1 <= pre <= MAX_PRE:
        raise ValueError(f"gemv_early: pre must be an int in 1..{MAX_PRE}, not {pre!r}")
    n, k = weight.shape
    pre = min(pre, triton.cdiv(k, block_k))  # blocks past K would load nothing but masks (qkv: K 2048 = 4 x 512)
    x = x.reshape(1, k).contiguous()
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    _gemv_early_kernel[(triton.cdiv(n, block_n),)](x, weight, y, n, k, weight.stride(0), BLOCK_N=block_n,
                                                   BLOCK_K=block_k, PRE=pre, EVEN=n % block_n == 0 and k % block_k == 0,
                                                   num_warps=num_warps, num_stages=1,
                                                   **launch_opts())
    return y
