"""An fp8 GEMV on the tensor cores for decode-sized inputs (1-16 rows): the weight tile goes to the MMA as it is.

Why: the GEMV of fp8_gemv.py multiplies on the CUDA cores, so every weight byte is converted e4m3 -> fp32
(two conversions, a quarter-rate instruction on H100) before its FMA; at one row that conversion, not the
memory, bounds the small projections (o_proj 0.57, qkv 0.65 of the bandwidth in session 3, docs/performance.md).
Here the row block is padded to ``BLOCK_M`` (16) rows and each ``[BLOCK_N, BLOCK_K]`` e4m3 weight tile meets the
e4m3 activations in ``tl.dot`` (``DOT_FP8``: an fp8 MMA, no conversion at all; else both sides as fp16, which
holds every e4m3 value exactly, one packed conversion per two weights). Unused MMA rows cost nothing that
matters: the kernel is bound by the weight stream, and the same launch serves 1 to 16 rows with one weight read.

Same W8A8 arithmetic as fp8_gemv.py and the ``_scaled_mm`` path: per row ``s_x = max(absmax / 448, 1e-12)``,
``q = e4m3(clamp(x / s_x))`` (IEEE division), ``y = (sum_k q * W) * s_x * s_w[n]`` in fp32 (products of e4m3
values are exact in fp32; only the summation order differs), rounded to the output dtype, then ``+ bias``.
``PRE_Q``: the rows are already e4m3 with their scales (made by the norm / SiLU kernels of fp8_fused.py).
Under ``TRITON_INTERPRET=1`` the e4m3 rounding runs in fp32 arithmetic (the interpreter's fp8 cast is wrong on
carries) and the dot in fp32 (tests/quant/test_fp8_gemv_tc.py, against the float64 reference).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.quant.fp8_gemv import _round_e4m3

ROWS_MAX = 16
# programmatic dependent launch (Hopper+): the GEMV's programs are launched while the previous kernel drains and
# wait for it in the kernel (``gdc_wait``) instead of behind the launch gap. ``OCTAVO_FP8_GEMV_PDL=1``; off by
# default until measured (docs/quantization.md, session 5)
PDL = env_switch("OCTAVO_FP8_GEMV_PDL", default=False)


@triton.jit
def _fp8_gemv_tc_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                        QUANT_X: tl.constexpr, PRE_Q: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                        SOFT_FP8: tl.constexpr, DOT_FP8: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False):
    """y[m, n] = (sum_k q(x[m, k]) * W[n, k]) * s_x[m] * s_w[n] (+ b[n]) for BLOCK_N outputs and all rows.
    ``USE_PDL``: launched as a programmatic dependent launch; nothing the previous kernel writes is read, and
    nothing is written, before ``gdc_wait`` (the weights and their scales are constants)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    r = tl.arange(0, BLOCK_M)
    rm = r < M
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + r[:, None] * stride_xm
    ws = tl.load(ws_ptr + n, mask=nm, other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    s_x = tl.full([BLOCK_M], 1.0, tl.float32)
    if PRE_Q:
        s_x = tl.load(xs_ptr + r, mask=rm, other=1.0)
    if QUANT_X:  # the rows' per-token scales (the rows are small and hot in L2)
        amax = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            kk = k + tl.arange(0, BLOCK_K)
            v = tl.load(x_rows + kk[None, :], mask=rm[:, None] & (kk[None, :] < K), other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        s_x = tl.maximum(tl.math.div_rn(tl.max(amax, axis=1), 448.0), 1e-12)  # IEEE, as torch
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(w_rows + kk[None, :])
        else:
            w = tl.load(w_rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
        x = tl.load(x_rows + kk[None, :], mask=rm[:, None] & (kk[None, :] < K), other=0.0)
        if QUANT_X:
            x = tl.minimum(tl.maximum(tl.math.div_rn(x.to(tl.float32), s_x[:, None]), -448.0), 448.0)
            if SOFT_FP8:
                x = _round_e4m3(x)
            else:
                x = x.to(tl.float8e4nv)
        if SOFT_FP8:  # interpreter: exact fp32 dot of e4m3 values
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        elif DOT_FP8:
            acc = tl.dot(x, tl.trans(w), acc)
        else:  # e4m3 -> fp16 is exact
            acc = tl.dot(x.to(tl.float16), tl.trans(w.to(tl.float16)), acc)
    y = (acc * s_x[:, None] * ws[None, :]).to(y_ptr.dtype.element_ty)
    if HAS_BIAS:  # torch adds the bias to the rounded product
        y = (y.to(tl.float32) + tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]).to(y.dtype)
    tl.store(y_ptr + r[:, None] * stride_ym + n[None, :], y, mask=rm[:, None] & nm[None, :])


def fp8_gemv_tc(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
                *, out_dtype: torch.dtype | None = None, x_scale: torch.Tensor | None = None,
                config: tuple[int, ...] = (16, 512, 4, 3), dot_fp8: bool = True) -> torch.Tensor:
    """``x [m, K]`` (m <= BLOCK_M; bf16/fp16/fp32, or e4m3 with ``x_scale [m, 1]``) times the e4m3 ``weight [N, K]``
    with per-output ``weight_scale``: W8A8 as fp8_gemv.fp8_gemv. ``config = (BLOCK_N, BLOCK_K, num_warps,
    num_stages[, BLOCK_M])``: BLOCK_M 16 (warp-level MMA), 32 or 64 (Hopper's warp-group MMA reads the tiles from
    shared memory; with the fp8 MMA it measured 2.5e-3 relative error on H100, its imprecise accumulation: an
    experiment only; fp16 MMAs accumulate in fp32); ``dot_fp8=False`` multiplies in fp16 instead of fp8 (the same
    products)."""
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"fp8_gemv_tc: weight {tuple(weight.shape)} (strides {weight.stride()}) does not fit x "
                         f"{tuple(x.shape)}; the weight must be [N, K] row-major")
    bm = config[4] if len(config) > 4 else 16
    if bm not in (16, 32, 64):
        raise ValueError(f"fp8_gemv_tc: BLOCK_M {bm}; 16, 32 or 64")
    if m > bm:
        raise ValueError(f"fp8_gemv_tc: {m} rows; at most {bm} (BLOCK_M; use torch._scaled_mm above)")
    if x.stride(-1) != 1:
        x = x.contiguous()
    pre = x_scale is not None
    if pre and (x.dtype != torch.float8_e4m3fn or x_scale.numel() != m):
        raise ValueError(f"fp8_gemv_tc: with x_scale, x must be float8_e4m3fn with one scale per row; got "
                         f"{x.dtype}, {x_scale.numel()} scales for {m} rows")
    y = torch.empty(m, n, dtype=out_dtype or (torch.bfloat16 if pre else x.dtype), device=x.device)
    if m == 0:
        return y
    ws = weight_scale.reshape(-1)
    soft = os.environ.get("TRITON_INTERPRET") == "1"
    bn, bk, warps, stages = (16, 64, 4, 1) if soft else config[:4]
    _fp8_gemv_tc_kernel[(triton.cdiv(n, bn),)](
        x, x_scale.reshape(-1) if pre else ws, weight, ws, bias, y, m, n, k, x.stride(0), weight.stride(0),
        y.stride(0), QUANT_X=not pre, PRE_Q=pre, HAS_BIAS=bias is not None,
        EVEN=not soft and k % bk == 0 and n % bn == 0, SOFT_FP8=soft, DOT_FP8=dot_fp8,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
        **({"USE_PDL": True, "launch_pdl": True} if PDL and not soft else {}))
    return y


_CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp8_configs")


def tc_config(n: int, k: int, device_name: str) -> tuple[bool, tuple[int, int, int, int]] | None:
    """The measured best ``(dot_fp8, (BLOCK_N, BLOCK_K, num_warps, num_stages))`` for an ``[n, k]`` weight on
    this card (``fp8_configs/gemv_tc.json``: card name -> ``"NxK"`` -> ``["fp8" | "f16", BN, BK, warps,
    stages]``, written from benchmarks/fp8_gemv_bench.py), or None where none was measured."""
    import json

    path = os.path.join(_CONFIG_DIR, "gemv_tc.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        table = json.load(f).get(device_name, {})
    row = table.get(f"{n}x{k}")
    if row is None:
        return None
    dot, *cfg = row
    if dot not in ("fp8", "f16") or len(cfg) not in (4, 5):
        raise ValueError(f"{path}: {device_name} {n}x{k}: {row!r} is not [\"fp8\"|\"f16\", BN, BK, warps, stages"
                         "(, BM)]")
    return dot == "fp8", tuple(int(c) for c in cfg)
