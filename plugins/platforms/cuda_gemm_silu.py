"""The gate/up projection with SiLU-and-mul in its epilogue, for Llama-style MLPs at 2-256 rows (issue 17).

Why: the unfused MLP writes ``[M, 2I]`` from the gate/up GEMM, then a SiLU-and-mul kernel reads it back and writes
``[M, I]``: at ~200 rows of Llama-3-8B that is ~17 MB of extra traffic and one launch per layer (~8 us), at
Qwen3-0.6B ~2.4 us of a ~30 us layer. Here one CTA owns output columns ``[n, n + BN)`` and accumulates both the
gate rows ``n..`` and the up rows ``I + n..`` of the merged weight (the layout of ``MergedColumnParallelLinear``:
``[gate; up]``), then stores ``silu(gate) * up`` with the unfused path's roundings: each GEMM output rounded to
the dtype, the SiLU rounded, the product rounded (``cuda_fusions._silu_and_mul_kernel``'s arithmetic).

Which launch per weight shape and row count: :data:`TABLE` (measured only; empty = the unfused path). Reached
from ``cuda_mlp_fusion``'s MLP forward for multi-row inputs; each (shape, launch) is checked against the unfused
layers on its first eager use, as ``cuda_gemm.linear`` does. ``OCTAVO_TRITON_GEMM=0`` turns it off with the GEMM.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_gemm import GemmConfig, active, first_use_ok
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait


@triton.jit(do_not_specialize=["M"], do_not_specialize_on_alignment=["M"])
def _gemm_silu_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    """out[m, n] = silu(x @ w[n]) * (x @ w[N + n]) for rows [pid_m*BM, +BM), columns [pid_n*BN, +BN); N = I (the
    output width, a multiple of BN: checked by the launcher). First weight tiles load before ``gdc_wait``."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    xp = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    gp = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    up = gp + N.to(tl.int64) * stride_wn
    bg = tl.load(gp)
    bu = tl.load(up)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    a = tl.load(xp, mask=m_ok[:, None], other=0.0)
    acc_g = tl.dot(a, tl.trans(bg), tl.zeros([BM, BN], dtype=tl.float32))
    acc_u = tl.dot(a, tl.trans(bu), tl.zeros([BM, BN], dtype=tl.float32))
    for _ in range(BK, K, BK):
        xp += BK
        gp += BK
        up += BK
        a = tl.load(xp, mask=m_ok[:, None], other=0.0)
        acc_g = tl.dot(a, tl.trans(tl.load(gp)), acc_g)
        acc_u = tl.dot(a, tl.trans(tl.load(up)), acc_u)
    g = acc_g.to(a.dtype).to(tl.float32)  # what the gate/up GEMM would store
    u = acc_u.to(a.dtype).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(a.dtype).to(tl.float32)  # as _silu_and_mul_kernel rounds
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :], (s * u).to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None])


def gemm_silu(x, weight, cfg: GemmConfig, pdl: dict | None = None):
    """``silu(x @ W[:I]^T) * (x @ W[I:]^T)`` for ``x [M, K]`` and a merged gate/up ``W [2I, K]`` (``cfg.split_k``
    must be 1, ``I`` a multiple of ``cfg.bn``, ``K`` of ``cfg.bk``)."""
    import torch

    M, K = x.shape
    two_i = weight.shape[0]
    n = two_i // 2
    if (weight.shape[1] != K or two_i % 2 or x.stride(1) != 1 or weight.stride(1) != 1 or cfg.split_k != 1
            or n % cfg.bn or K % cfg.bk):
        raise ValueError(f"gemm_silu: x {tuple(x.shape)} / weight {tuple(weight.shape)} do not fit {cfg.name()} "
                         "(split 1, I a multiple of bn, K of bk, unit column strides)")
    out = torch.empty(M, n, dtype=x.dtype, device=x.device)
    if M:
        _gemm_silu_kernel[(triton.cdiv(M, cfg.bm), n // cfg.bn)](
            x, weight, out, M, n, K, x.stride(0), weight.stride(0), out.stride(0), BM=cfg.bm, BN=cfg.bn, BK=cfg.bk,
            num_warps=cfg.warps, num_stages=cfg.stages, **(pdl or {}))
    return out


#: (2I, K) of the merged gate/up weight -> [(most rows, config or None)], as ``cuda_gemm.TABLE``
TABLE: dict[tuple[int, int], list[tuple[int, GemmConfig | None]]] = {}
_CHECKED: dict = {}
_INTERPRET_TABLE = False  # tests route the interpreter through the table


def gate_up_silu(x, weight, unfused):
    """The fused launch's output for this row count and weight, or None (the caller runs ``unfused(x)``): not
    listed, off, or it disagreed with ``unfused`` (the layers' own gate/up + SiLU-and-mul) on its first eager
    use by more than two rounding steps of the dtype (then dropped with a warning)."""
    import os

    import torch

    if (not active() or x.dim() != 2 or x.shape[0] < 2 or x.stride(1) != 1 or x.dtype != weight.dtype
            or x.dtype not in (torch.bfloat16, torch.float16)
            or os.environ.get("TRITON_INTERPRET") == "1" and not _INTERPRET_TABLE):
        return None
    cfg = None
    for most, c in TABLE.get(tuple(weight.shape), ()):
        if x.shape[0] <= most:
            cfg = c
            break
    if cfg is None:
        return None
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    if not first_use_ok(_CHECKED, (tuple(weight.shape), cfg, x.dtype), lambda: gemm_silu(x, weight, cfg, launch_opts()),
                        lambda: unfused(x), f"gate/up + SiLU GEMM {cfg.name()} for {tuple(weight.shape)}"):
        return None
    return gemm_silu(x, weight, cfg, launch_opts())
