"""The batch-1 (one-row) bf16/fp16 GEMV and the dense linear method that uses it (installed by ``cuda_fusions.fuse_model``).

At batch 1 a dense decode step is weight-bandwidth bound: each program streams ``BLOCK_N`` weight rows over the full K,
hundreds of programs per weight, tuned per weight shape (a fixed tile from ``cuda_gemv_table.py`` where one was measured,
else Triton's autotuner over ``_GEMV_CONFIGS``). ``cuda_fusions`` re-exports these names (other plugins and tests use them
from there).
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """y[n] = sum_k x[k] * W[n, k] (+ b[n]) for one row x: each program owns BLOCK_N outputs, full K."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k0 = 0
    if PDL:  # cuda_pdl.py: the first weight tile loads while the producer of x finishes (weights never change)
        kk = tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(rows + kk[None, :])
        else:
            w = tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
        gdc_wait()
        gdc_launch_dependents()
        if EVEN:
            x = tl.load(x_ptr + kk)
        else:
            x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        k0 = BLOCK_K
    for k in range(k0, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(rows + kk[None, :])
            x = tl.load(x_ptr + kk)
        else:
            w = tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
            x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=nm)


_GEMV_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st)
                 for bn, bk, w, st in ((8, 512, 4, 3), (16, 512, 4, 3), (16, 256, 4, 4), (32, 256, 4, 3),
                                       (16, 1024, 8, 3), (32, 512, 8, 3), (64, 256, 8, 2), (8, 1024, 4, 4))]
# cache_results: the timings go to Triton's cache dir, so a warm (or shipped, cuda_kernel_cache.py) start does not
# re-time 8 tiles per weight shape (~3.7 s of an 8B start on an H100, docs/performance.md "Start-up")
_CACHE_TUNING = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
_gemv_autotuned = triton.autotune(configs=_GEMV_CONFIGS, key=["N", "K", "HAS_BIAS", "EVEN"],
                                  **_CACHE_TUNING)(_gemv_kernel)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for a single row ``x [1, K]`` (batch-1 decode), tuned per weight shape on first use."""
    import os

    N, K = weight.shape
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    even = K % 1024 == 0 and N % 64 == 0
    from octavo.plugins.platforms.cuda_gemv_table import lookup

    tile = lookup(N, K, weight.device) if bias is None else None  # fixed per-shape tiles (cuda_gemv_table.py)
    if tile is not None:
        _gemv_kernel[(triton.cdiv(N, tile["BLOCK_N"]),)](x, weight, bias, y, N, K, weight.stride(0), HAS_BIAS=False,
                                                          EVEN=even, **tile, **launch_opts())
        return y
    if os.environ.get("TRITON_INTERPRET") == "1":  # no timer to autotune with: one fixed tile
        _gemv_kernel[(triton.cdiv(N, 16),)](x, weight, bias, y, N, K, weight.stride(0), HAS_BIAS=bias is not None,
                                            EVEN=False, BLOCK_N=16, BLOCK_K=64, **launch_opts())
        return y
    _gemv_autotuned[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)](
        x, weight, bias, y, N, K, weight.stride(0), HAS_BIAS=bias is not None, EVEN=even, **launch_opts())
    return y


def _gemv_linear_method():
    from octavo.nn.linear import UnquantizedLinearMethod
    from octavo.plugins.platforms.cuda_gemm import linear as triton_gemm

    class TritonGemvLinearMethod(UnquantizedLinearMethod):
        """Dense weights; a single-row input (batch-1 decode) goes through :func:`gemv`, row counts and weight
        shapes in ``cuda_gemm.TABLE`` (decode steps of 2-256 rows) through its Triton GEMM, the rest through
        ``F.linear`` (cuBLAS)."""

        def apply(self, layer, x, bias=None):
            if x.dim() == 2 and x.shape[0] == 1 and layer.weight.stride(1) == 1:
                return gemv(x, layer.weight, bias)
            y = triton_gemm(x, layer.weight) if bias is None else None
            return y if y is not None else super().apply(layer, x, bias)

    return TritonGemvLinearMethod()


# ------------------------------------------------------------------------------------ installing
