"""The quantizing RMSNorm done in the prologue of the one-row fp8 GEMV that consumes it, by a persistent grid (session
16, engineer fp816; a kernel and its tests only, not wired into the engine yet: the next session's A/B decides).

Why: at batch 1 the 8B forward runs 64 quantizing norms (fp8_fused.py), 200 us of its critical path (3.1 us each: the
GEMV before must end, one L2 trip for x / residual, two block reductions, the stores, this kernel's end before the GEMV
after may read them). Moving the norm into the producing GEMV's tail lost (session 14: the fence + ticket); moving the
trips elsewhere lost (session 16). What stays: doing the norm where its consumer already is. A plain grid cannot
(qkv's 1,536 and gate_up's 7,168 programs would each redo the row's two reductions and every later wave again), so this
grid is persistent: ``programs`` programs (the SMs times the programs an SM holds), each computes the normed,
quantized row ONCE (the norm kernel's expressions, on this kernel's warps) and then streams its tiles (program ``p``
takes tiles ``p, p + programs, ...``), each tile's blocks through the one-row GEMV's split-accumulator step in order.
Program 0 also stores the new residual (the norm kernel's ``res_out``), into a buffer no program of this launch reads.

Bits: the GEMV part is fp8_gemv's (the same products, the same split accumulator, blocks in the same order, the same
final scaling). The norm part is fp8_fused._rms_norm_quant_kernel's expressions, but its sum of squares is reduced on
this kernel's warps (the norm kernel's 16): ``rstd`` may differ in its last bits, and then an element of the normed row
a bf16 step (the interpreter sums both alike: bit-equal there; the GPU test counts the elements that differ).

PDL: the first tile's first weight block and the norm weight are read before ``griddepcontrol.wait`` (no kernel of the
step writes them), the dependents let in after it, as fp8_gemv's ``PDL_W``; the first tile's other blocks are asked for
right after the wait, so they stream while the norm runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugins.quant.fp8_e4m3 import _quant_e4m3


@triton.jit
def _block(xq, b: tl.constexpr, NB: tl.constexpr):
    """Row ``b`` of ``xq [NB, BLOCK_K]``, exactly (a max over -inf fills keeps -0.0)."""
    return tl.max(tl.where(tl.arange(0, NB)[:, None] == b, xq, -float("inf")), 0)


@triton.jit
def _norm_gemv_kernel(x_ptr, r_ptr, nw_ptr, ro_ptr, w_ptr, ws_ptr, y_ptr, N, K, stride_wn, eps,
                      HAS_RES: tl.constexpr, SOFT_FP8: tl.constexpr, KP: tl.constexpr, NB: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACC_SPLIT: tl.constexpr, USE_PDL: tl.constexpr):
    """``y = fp8_gemv(rms_norm_quant(x + r, nw))`` for one row (module docstring); ``NB = K // BLOCK_K`` blocks a row,
    ``KP`` = ``NB * BLOCK_K`` (K a multiple of BLOCK_K, N of BLOCK_N)."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    n_tiles = N // BLOCK_N
    cols = tl.arange(0, KP)
    nw = tl.load(nw_ptr + cols)  # constants: before the wait
    kb = tl.arange(0, BLOCK_K)
    rows0 = w_ptr + (pid * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None] * stride_wn
    w0 = tl.load(rows0 + kb[None, :])  # the host keeps the grid <= the tiles: every program has one
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # the first tile's other blocks asked for now: in flight while the norm below runs (not after it)
    w1 = w0
    w2 = w0
    w3 = w0
    if NB > 1:
        w1 = tl.load(rows0 + (BLOCK_K + kb)[None, :])
    if NB > 2:
        w2 = tl.load(rows0 + (2 * BLOCK_K + kb)[None, :])
    if NB > 3:
        w3 = tl.load(rows0 + (3 * BLOCK_K + kb)[None, :])
    # the norm kernel's expressions (fp8_fused._rms_norm_quant_kernel, _quant_row_store), once a program
    x = tl.load(x_ptr + cols)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(r_ptr + cols).to(tl.float32)).to(x.dtype)  # torch rounds the sum
        if pid == 0:
            tl.store(ro_ptr + cols, x)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
    o = ((xf * rstd).to(x.dtype).to(tl.float32) * nw.to(tl.float32)).to(y_ptr.dtype.element_ty).to(tl.float32)
    s_x = tl.maximum(tl.math.div_rn(tl.max(tl.abs(o), 0), 448.0), 1e-12)
    xq = tl.reshape(_quant_e4m3(o, s_x, SOFT_FP8), [NB, BLOCK_K])  # the e4m3 values the norm kernel stores
    xb0 = _block(xq, 0, NB)  # the row's blocks, taken out once (NB <= 4; -0.0 kept)
    xb1 = xb0
    xb2 = xb0
    xb3 = xb0
    if NB > 1:
        xb1 = _block(xq, 1, NB)
    if NB > 2:
        xb2 = _block(xq, 2, NB)
    if NB > 3:
        xb3 = _block(xq, 3, NB)
    _tile(w0, w1, w2, w3, xb0, xb1, xb2, xb3, pid, s_x, ws_ptr, y_ptr, NB, BLOCK_N, BLOCK_K, ACC_SPLIT)
    for t in range(pid + progs, n_tiles, progs):
        rows = w_ptr + (t * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None] * stride_wn
        w0 = tl.load(rows + kb[None, :])
        if NB > 1:
            w1 = tl.load(rows + (BLOCK_K + kb)[None, :])
        if NB > 2:
            w2 = tl.load(rows + (2 * BLOCK_K + kb)[None, :])
        if NB > 3:
            w3 = tl.load(rows + (3 * BLOCK_K + kb)[None, :])
        _tile(w0, w1, w2, w3, xb0, xb1, xb2, xb3, t, s_x, ws_ptr, y_ptr, NB, BLOCK_N, BLOCK_K, ACC_SPLIT)


@triton.jit
def _step(acc, w, xb, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACC_SPLIT: tl.constexpr):
    prod = w.to(tl.float32) * xb[None, :]  # fp8_gemv._gemv_step's split accumulator
    return acc + tl.sum(tl.reshape(prod, [BLOCK_N, BLOCK_K // ACC_SPLIT, ACC_SPLIT]), 2)


@triton.jit
def _tile(w0, w1, w2, w3, xb0, xb1, xb2, xb3, t, s_x, ws_ptr, y_ptr, NB: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, ACC_SPLIT: tl.constexpr):
    """Tile ``t``'s outputs from its NB weight blocks, in fp8_gemv's order (block 0 first), and fp8_gemv's scaling."""
    n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _step(tl.zeros([BLOCK_N, BLOCK_K // ACC_SPLIT], dtype=tl.float32), w0, xb0, BLOCK_N, BLOCK_K, ACC_SPLIT)
    if NB > 1:
        acc = _step(acc, w1, xb1, BLOCK_N, BLOCK_K, ACC_SPLIT)
    if NB > 2:
        acc = _step(acc, w2, xb2, BLOCK_N, BLOCK_K, ACC_SPLIT)
    if NB > 3:
        acc = _step(acc, w3, xb3, BLOCK_N, BLOCK_K, ACC_SPLIT)
    tl.store(y_ptr + n, (tl.sum(acc, 1) * s_x * tl.load(ws_ptr + n)).to(y_ptr.dtype.element_ty))

def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              weight: torch.Tensor, weight_scale: torch.Tensor, *, tile: tuple[int, int, int] = (4, 1024, 4),
              programs: int | None = None, acc_split: int = 16, pdl: bool = False):
    """``(y [1, N], new_residual [1, K] or None)``: the quantizing RMSNorm of ``x (+ residual)`` and the one-row fp8
    GEMV of its e4m3 copy, in one persistent launch. ``programs``: the grid (default: 4 an SM)."""
    import os

    k = x.shape[-1]
    n = weight.shape[0]
    bn, bk, warps = tile
    if (x.numel() != k or weight.shape[1] != k or k % bk or n % bn or weight.stride(1) != 1 or k & (k - 1)
            or weight.dtype != torch.float8_e4m3fn or k // bk > 4):
        raise ValueError(f"norm_gemv: one row of K={k} (a power of two, 1-4 blocks of {bk}) and an e4m3 [N, K] weight "
                         f"with N a multiple of {bn}; got x {tuple(x.shape)}, weight {tuple(weight.shape)} "
                         f"{weight.dtype}")
    soft = os.environ.get("TRITON_INTERPRET") == "1"
    if soft:
        progs = programs or 3
    else:
        # 4 an SM: sm_90 SASS of the 4x1024 tile, 4 warps, holds 122 registers a thread (Triton 3.6 and 3.9)
        progs = programs or 4 * torch.cuda.get_device_properties(x.device).multi_processor_count
    progs = min(progs, n // bn)
    y = torch.empty(1, n, dtype=torch.promote_types(norm_weight.dtype, x.dtype), device=x.device)
    ro = torch.empty(1, k, dtype=x.dtype, device=x.device) if residual is not None else None
    extra = {"launch_pdl": True} if pdl and not soft else {}
    _norm_gemv_kernel[(progs,)](
        x.reshape(-1), residual.reshape(-1) if residual is not None else x.reshape(-1), norm_weight,
        ro.reshape(-1) if ro is not None else x.reshape(-1), weight, weight_scale.reshape(-1), y, n, k,
        weight.stride(0), eps, HAS_RES=residual is not None, SOFT_FP8=soft, KP=k, NB=k // bk, BLOCK_N=bn,
        BLOCK_K=bk, ACC_SPLIT=acc_split, USE_PDL=bool(pdl and not soft), num_warps=warps, num_stages=1, **extra)
    return y, ro
