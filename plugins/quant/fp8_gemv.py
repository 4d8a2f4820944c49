"""A Triton fp8 GEMV for decode-sized inputs (a few rows): fp8 weights, per-token activation quantization
and both scales fused into one kernel.

Why: at batch 1 an fp8 linear layer was two kernels, the per-token quantization (fp8_triton.py) and
``torch._scaled_mm``, whose CUTLASS tiles are sized for many rows: with one row an ``N = 4096`` output gives
it a few dozen thread blocks on 132 SMs, far from the memory bandwidth a GEMV needs (fp8 batch-1 decode was
0.43-0.48 of its roofline on H100, docs/performance.md). Here each program owns ``BLOCK_N`` output columns
and streams their weight rows once: hundreds of programs, one launch per linear, like the bf16 Triton GEMV
of plugins/platforms/cuda_fusions.py.

What it computes is W8A8, the same as the ``_scaled_mm`` path, so a model gives the same answer whichever
path a batch size takes (up to fp32 summation order): for each row ``m`` the absmax of ``x[m]`` gives
``s_x = max(absmax / 448, 1e-12)``; each element is divided by it (IEEE division, ``div_rn``, as torch
divides), clamped to +-448 and rounded to e4m3; then ``y[m, n] = (sum_k q[m, k] * W[n, k]) * s_x * s_w[n]``
in fp32 (e4m3 products are exact in fp32), rounded to the output dtype, then ``+ bias``.

One row: autotuned tiles, the row's absmax read first (or the norm's e4m3 copy read instead). 2-16 rows: a
second kernel (fp8_gemv_rows.py) loads each weight tile once for all rows; on H100 it measured slower than ``_scaled_mm`` from 2
rows on and two of its GPU checks failed undiagnosed (batch 1), so the engine only uses one row
(``OCTAVO_FP8_GEMV_MAX_M`` is 0 or 1); it stays for experiments and its interpreter test. ``TRITON_INTERPRET=1`` runs it
on CPU tensors (tests/quant/test_fp8_gemv.py, against a float64 reference). This module imports Triton:
fp8.py imports it on first use, never at plugin import.
"""

from __future__ import annotations

import inspect
import os

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_choice, env_switch
from octavo.plugins.quant import fp8_gemv_tiles
from octavo.plugins.quant.fp8_e4m3 import _e4m3_bits_f32, _quant_e4m3, _round_e4m3  # noqa: F401 (imported from here)
from octavo.plugins.quant.fp8_gemv_l2 import _prefetch_next, _prefetch_rows_once, prefetch_args

# (BLOCK_N, BLOCK_K, num_warps, num_stages): BLOCK_K fp8 bytes per weight row per step; BLOCK_K <= 1024 (the
# EVEN flag is computed for 1024). Session 5 (H100, one row, graph of back-to-back calls): (16, 512) best for qkv,
# (8, 1024) for o_proj and gate_up, (16, 1024, 8) for down; (32, 512) never best -> replaced by (4, 1024), more
# programs for the small projections (o_proj and qkv stream at only 0.54-0.64 of the bandwidth)
_CONFIGS = ((16, 512, 4, 3), (4, 1024, 4, 3), (16, 1024, 8, 3), (8, 1024, 4, 4))


@triton.jit
def _gemv_step(acc, w, x_row, kk, s_x, K, QUANT_X: tl.constexpr, PRE_Q: tl.constexpr, EVEN: tl.constexpr,
               SOFT_FP8: tl.constexpr, X2D: tl.constexpr, W_BITS: tl.constexpr, ACC_SPLIT: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One weight block ``w`` (the columns ``kk``) of the one-row kernel into its accumulator (docstring below)."""
    if EVEN:
        x = tl.load(x_row + kk).to(tl.float32)
    else:
        x = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
    if QUANT_X:
        x = _quant_e4m3(x, s_x, SOFT_FP8)
    if X2D and EVEN and PRE_Q:  # x read in the weight tile's own layout (each row's copy from L1): no
        xb = tl.load(x_row + kk[None, :] + tl.zeros([BLOCK_N, 1], tl.int32)).to(tl.float32)  # smem broadcast
    else:
        xb = x[None, :]
    if ACC_SPLIT > 0:  # each thread's run of ACC_SPLIT products summed at once: 1/ACC_SPLIT the registers
        prod = w.to(tl.float32) * xb
        acc += tl.sum(tl.reshape(prod, [BLOCK_N, BLOCK_K // ACC_SPLIT, ACC_SPLIT]), 2)
    elif W_BITS:
        acc += _e4m3_bits_f32(w) * (xb * 18446744073709551616.0)  # W 2**-120 * x 2**64
    else:
        acc += w.to(tl.float32) * xb
    return acc


@triton.jit
def _fp8_gemv_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, pf_ptr, pf_total, pf_piece, M, N, K, stride_xm,
                     stride_wn, stride_ym, QUANT_X: tl.constexpr, PRE_Q: tl.constexpr, HAS_BIAS: tl.constexpr,
                     EVEN: tl.constexpr, SOFT_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PREFETCH: tl.constexpr = False, USE_PDL: tl.constexpr = False, SELF_PF: tl.constexpr = False,
                     W_BITS: tl.constexpr = False, REG_PF: tl.constexpr = False, ACC_SPLIT: tl.constexpr = 0,
                     X2D: tl.constexpr = False, PDL_W: tl.constexpr = False, AMAX_KP: tl.constexpr = 0,
                     LOOP2: tl.constexpr = 0):
    """y[m, n] = (sum_k q(x[m, k]) * W[n, k]) * s_x[m] * s_w[n] (+ b[n]): each program owns BLOCK_N outputs.
    ``PRE_Q``: ``x`` is already e4m3 with its scales at ``xs_ptr`` (made by the norm kernel).
    ``USE_PDL``: launched as a programmatic dependent launch: only the weight scales (constants) are read before
    ``gdc_wait``. ``PREFETCH``: the last programs then ask L2 for the next layer's weight (fp8_prefetch.py).
    ``SELF_PF`` (with ``EVEN``): each program first asks L2 for all its weight rows at once (one bulk request a
    row), so its slice streams at full depth while it reads the activations (or waits for its producer).
    ``W_BITS`` (with e4m3 activations: ``QUANT_X`` or ``PRE_Q``): the weight bytes become fp32 by integer ops
    (``_e4m3_bits_f32``: 3 ALU ops instead of 1.5 conversions an element) and the activations are scaled by
    2**64: every product is the same product times 2**-56 (exact, in the normal range) and the sum is scaled back
    exactly, so the output is bit-for-bit the conversion path's. ``REG_PF`` (with ``EVEN``): the next weight block
    is loaded into registers before this block's math (the loop's loads are not staged by Triton's pipeliner:
    no dot consumes them), the same sums in the same order. ``ACC_SPLIT`` > 0: the accumulator holds each thread's
    sums of ACC_SPLIT adjacent products (fewer registers, more programs per SM; another fp32 summation order).
    ``PDL_W`` (with ``USE_PDL``, ``EVEN``, one row; 1-4): the first ``PDL_W`` weight blocks are loaded before
    ``gdc_wait`` (weights do not depend on the producer: the resident programs stream them while the producer
    runs) and the kernel lets its own dependents launch once it has waited; the same sums in the same order. The
    host caps it so that ``PDL_W * BLOCK_K <= K``. ``AMAX_KP`` (with ``QUANT_X``; a power of two >= K): the row's
    absmax from loads all issued at once (an unrolled loop of ``AMAX_KP // 2048`` blocks) instead of a loop that
    waits for each block before asking for the next (down's 14 blocks: 14 L2 round trips after the PDL wait); max
    is exact, so the same scale. ``LOOP2`` (2 or 4; with ``EVEN``, not ``REG_PF``): the main loop loads two (four)
    weight blocks a trip before the math of any (twice the bytes in flight a program; N = 4096's 256 programs otherwise wait
    for one block per DRAM round trip); the same sums in the same order."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    if SELF_PF and EVEN:  # EVEN: K a multiple of 1024 bytes, every row of the block real; one request a row
        _prefetch_rows_once(w_ptr, tl.program_id(0) * BLOCK_N, stride_wn, K, BLOCK_N)
    ws = tl.load(ws_ptr + n, mask=nm, other=0.0)
    if PDL_W and EVEN:  # static ifs: the names stay in scope after them
        w_first = tl.load(rows + tl.arange(0, BLOCK_K)[None, :])
    if PDL_W > 1 and EVEN:
        w_b1 = tl.load(rows + (BLOCK_K + tl.arange(0, BLOCK_K))[None, :])
    if PDL_W > 2 and EVEN:
        w_b2 = tl.load(rows + (2 * BLOCK_K + tl.arange(0, BLOCK_K))[None, :])
    if PDL_W > 3 and EVEN:
        w_b3 = tl.load(rows + (3 * BLOCK_K + tl.arange(0, BLOCK_K))[None, :])
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if PDL_W:
            tl.extra.cuda.gdc_launch_dependents()
    for m in range(0, M):
        x_row = x_ptr + m * stride_xm
        s_x = 1.0
        if PRE_Q:
            s_x = tl.load(xs_ptr + m)
        if QUANT_X and AMAX_KP > 0:  # this row's per-token scale, every load in flight at once
            amax1 = tl.zeros([AMAX_BLOCK], dtype=tl.float32)
            for k in tl.static_range(0, AMAX_KP, AMAX_BLOCK):  # own names: kk / v of another shape would be
                ka = k + tl.arange(0, AMAX_BLOCK)  # loop-carried into the main loop (a compile error)
                va = tl.load(x_row + ka, mask=ka < K, other=0.0).to(tl.float32)
                amax1 = tl.maximum(amax1, tl.abs(va))
            s_x = tl.maximum(tl.math.div_rn(tl.max(amax1, axis=0), 448.0), 1e-12)  # IEEE, as torch
        elif QUANT_X:  # this row's per-token scale (the row is small and hot in L2)
            amax = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                kk = k + tl.arange(0, BLOCK_K)
                v = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.abs(v))
            s_x = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), 448.0), 1e-12)  # IEEE, as torch
        if ACC_SPLIT > 0:
            acc = tl.zeros([BLOCK_N, BLOCK_K // ACC_SPLIT], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        if REG_PF and EVEN:
            w_nx = tl.load(rows + tl.arange(0, BLOCK_K)[None, :])
        k0 = 0
        if PDL_W and EVEN:  # the blocks loaded before the wait, in order (the same weight blocks for every row)
            acc = _gemv_step(acc, w_first, x_row, tl.arange(0, BLOCK_K), s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8,
                             X2D, W_BITS, ACC_SPLIT, BLOCK_N, BLOCK_K)
            k0 = BLOCK_K
        if PDL_W > 1 and EVEN:
            acc = _gemv_step(acc, w_b1, x_row, BLOCK_K + tl.arange(0, BLOCK_K), s_x, K, QUANT_X, PRE_Q, EVEN,
                             SOFT_FP8, X2D, W_BITS, ACC_SPLIT, BLOCK_N, BLOCK_K)
            k0 = 2 * BLOCK_K
        if PDL_W > 2 and EVEN:
            acc = _gemv_step(acc, w_b2, x_row, 2 * BLOCK_K + tl.arange(0, BLOCK_K), s_x, K, QUANT_X, PRE_Q, EVEN,
                             SOFT_FP8, X2D, W_BITS, ACC_SPLIT, BLOCK_N, BLOCK_K)
            k0 = 3 * BLOCK_K
        if PDL_W > 3 and EVEN:
            acc = _gemv_step(acc, w_b3, x_row, 3 * BLOCK_K + tl.arange(0, BLOCK_K), s_x, K, QUANT_X, PRE_Q, EVEN,
                             SOFT_FP8, X2D, W_BITS, ACC_SPLIT, BLOCK_N, BLOCK_K)
            k0 = 4 * BLOCK_K
        if LOOP2 == 4 and EVEN and not REG_PF:  # four blocks a trip: all four loads in flight before any math
            k_quads = k0 + (K - k0) // (4 * BLOCK_K) * (4 * BLOCK_K)
            for k in range(k0, k_quads, 4 * BLOCK_K):
                kk = k + tl.arange(0, BLOCK_K)
                wa = tl.load(rows + kk[None, :])
                wb = tl.load(rows + (kk + BLOCK_K)[None, :])
                wc = tl.load(rows + (kk + 2 * BLOCK_K)[None, :])
                wd = tl.load(rows + (kk + 3 * BLOCK_K)[None, :])
                acc = _gemv_step(acc, wa, x_row, kk, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D, W_BITS, ACC_SPLIT,
                                 BLOCK_N, BLOCK_K)
                acc = _gemv_step(acc, wb, x_row, kk + BLOCK_K, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D, W_BITS,
                                 ACC_SPLIT, BLOCK_N, BLOCK_K)
                acc = _gemv_step(acc, wc, x_row, kk + 2 * BLOCK_K, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D,
                                 W_BITS, ACC_SPLIT, BLOCK_N, BLOCK_K)
                acc = _gemv_step(acc, wd, x_row, kk + 3 * BLOCK_K, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D,
                                 W_BITS, ACC_SPLIT, BLOCK_N, BLOCK_K)
            k0 = k_quads  # 1-3 blocks left: the pair loop and the plain loop below
        if LOOP2 and EVEN and not REG_PF:  # two blocks a trip: both loads in flight before either's math
            k_pairs = k0 + (K - k0) // (2 * BLOCK_K) * (2 * BLOCK_K)
            for k in range(k0, k_pairs, 2 * BLOCK_K):
                kk = k + tl.arange(0, BLOCK_K)
                wa = tl.load(rows + kk[None, :])
                wb = tl.load(rows + (kk + BLOCK_K)[None, :])
                acc = _gemv_step(acc, wa, x_row, kk, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D, W_BITS, ACC_SPLIT,
                                 BLOCK_N, BLOCK_K)
                acc = _gemv_step(acc, wb, x_row, kk + BLOCK_K, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D, W_BITS,
                                 ACC_SPLIT, BLOCK_N, BLOCK_K)
            k0 = k_pairs  # an odd last block: the loop below
        for k in range(k0, K, BLOCK_K):
            kk = k + tl.arange(0, BLOCK_K)
            if EVEN:
                if REG_PF:  # this block came with the last iteration; ask for the next one before the math
                    w = w_nx
                    w_nx = tl.load(rows + (kk + BLOCK_K)[None, :], mask=(kk + BLOCK_K < K)[None, :], other=0.0)
                else:
                    w = tl.load(rows + kk[None, :])
            else:
                w = tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
            acc = _gemv_step(acc, w, x_row, kk, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D, W_BITS, ACC_SPLIT,
                             BLOCK_N, BLOCK_K)
        if W_BITS and ACC_SPLIT == 0:
            y = (tl.sum(acc, 1) * 72057594037927936.0 * s_x * ws).to(y_ptr.dtype.element_ty)  # * 2**56: exact
        else:
            y = (tl.sum(acc, 1) * s_x * ws).to(y_ptr.dtype.element_ty)
        if HAS_BIAS:  # torch adds the bias to the rounded product
            y = (y.to(tl.float32) + tl.load(b_ptr + n, mask=nm, other=0.0).to(tl.float32)).to(y.dtype)
        tl.store(y_ptr + m * stride_ym + n, y, mask=nm)
    if PREFETCH:
        _prefetch_next(pf_ptr, pf_total, pf_piece)


# the unrolled absmax's block (AMAX_KP): 2048 bf16 a load round, 8 rounds for K = 14336
AMAX_BLOCK = tl.constexpr(2048)


# the timings go to Triton's cache dir where this Triton can (as cuda_fusions' bf16 GEMV): a warm start skips
# re-timing 4 tiles x 2 input kinds per weight shape
_CACHE_TUNING = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
_fp8_gemv_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s) for bn, bk, w, s in _CONFIGS],
    key=["N", "K", "QUANT_X", "PRE_Q", "HAS_BIAS", "EVEN", "W_BITS", "REG_PF", "ACC_SPLIT"],
    **_CACHE_TUNING)(_fp8_gemv_kernel)

# the split accumulator's tiles: its registers (sm_90, Triton 3.6: 48-124 a thread for these) leave room for
# tiles the full accumulator could not hold; the four above plus two with more bytes in flight per SM
_SPLIT_CONFIGS = _CONFIGS + ((32, 512, 4, 3), (8, 1024, 2, 3))
_fp8_gemv_tuned_split = triton.autotune(
    configs=[triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s) for bn, bk, w, s in _SPLIT_CONFIGS],
    key=["N", "K", "QUANT_X", "PRE_Q", "HAS_BIAS", "EVEN", "W_BITS", "REG_PF", "ACC_SPLIT"],
    **_CACHE_TUNING)(_fp8_gemv_kernel)

#: the one-row kernel's weight conversion by integer ops (``W_BITS``; bit-identical output), for e4m3 activations.
#: ``OCTAVO_FP8_GEMV_BITS`` (default off until measured on a GPU); benchmarks flip this attribute for A/B runs
W_BITS = env_switch("OCTAVO_FP8_GEMV_BITS", default=False)
#: the one-row kernel's register prefetch of the next weight block (``REG_PF``; same sums, same order).
#: ``OCTAVO_FP8_GEMV_REG_PF`` (default off until measured on a GPU)
REG_PF = env_switch("OCTAVO_FP8_GEMV_REG_PF", default=False)
#: the one-row kernel's accumulator: 0 = one fp32 per weight element of the tile (64 registers a thread at
#: (8, 1024, 4 warps): 127 registers, 4 programs an SM on sm_90); 16 = each thread's 16 adjacent products summed
#: first (64 registers: twice the programs, so twice the weight bytes in flight; another fp32 summation order).
#: ``OCTAVO_FP8_GEMV_ACC_SPLIT`` (0, 8 or 16). Default 16: session 7 batch 1 (H100, one engine, same tiles), 8B
#: fp8 batch-1 decode 3.798 -> 3.675 ms/token (GEMVs 2760 -> 2661 us per forward; docs/performance.md)
ACC_SPLIT = int(env_choice("OCTAVO_FP8_GEMV_ACC_SPLIT", ("0", "8", "16"), "16"))
#: prequantized (norm-made e4m3) input read in the weight tile's layout: sm_90 SASS of the key loop loses its two
#: barriers and the shared-memory round trip per step; bit-identical. ``OCTAVO_FP8_GEMV_X2D`` (default off until measured)
X2D = env_switch("OCTAVO_FP8_GEMV_X2D", default=False)
#: the one-row kernel's in-kernel absmax with all its loads in flight at once (``AMAX_KP``; the same scale), for
#: K <= AMAX_MAX_K. ``OCTAVO_FP8_GEMV_AMAX_ONE``: on since session 15 (H100: down's critical path -15 us in each of
#: 4 engine measures across sessions 12 and 15, forward -17 us; GEMV bits equal in the GPU test; at batch 1 down and
#: o_proj quantize in the GEMV, the norms hand the other two e4m3)
AMAX_ONE = env_switch("OCTAVO_FP8_GEMV_AMAX_ONE", default=True)
AMAX_MAX_K = 16384
#: the one-row kernel's main loop: 0, or 2 / 4 weight blocks a trip (``LOOP2``; the same result). None (unset):
#: fp8_gemv_tiles.LOOPS decides for the table's tiles (H100 and H200: o_proj and down 2), else 0. ``OCTAVO_FP8_GEMV_LOOP2``
_LOOP2_RAW = os.environ.get("OCTAVO_FP8_GEMV_LOOP2", "").strip()
if _LOOP2_RAW not in ("", "0", "2", "4"):
    raise ValueError(f"OCTAVO_FP8_GEMV_LOOP2={_LOOP2_RAW!r}: 0, 2 or 4 weight blocks a loop trip")
LOOP2: int | None = int(_LOOP2_RAW) if _LOOP2_RAW else None
#: the most weight blocks the one-row kernel reads before its PDL wait (``pdl_w``; its static ifs)
MAX_PDL_W = 4


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
             *, quantize_input: bool = True, out_dtype: torch.dtype | None = None,
             config: tuple[int, int, int] | None = None, x_scale: torch.Tensor | None = None,
             prefetch: tuple[torch.Tensor, int] | None = None, pdl: bool = False,
             self_prefetch: bool = False, w_bits: bool | None = None, reg_pf: bool | None = None,
             acc_split: int | None = None, x2d: bool | None = None, pdl_w: bool | int = False,
             amax_one: bool | None = None, loop2: int | None = None, tail: dict | None = None) -> torch.Tensor:
    """``x [m, K]`` (bf16/fp16/fp32) times the e4m3 ``weight [N, K]`` with ``weight_scale`` (``N`` values).

    ``quantize_input=True`` is W8A8 (dynamic per-token e4m3 activations, as the ``_scaled_mm`` path);
    ``False`` multiplies the activations as they are (W8A16). Returns ``[m, N]`` in ``out_dtype`` (default
    ``x.dtype``). Autotuned per (N, K) on first use on a GPU; call it once outside CUDA-graph capture.
    ``config=(BLOCK_N, BLOCK_K, num_warps[, stages[, maxnreg]])`` skips its tuning (tests; default: fp8_gemv_tiles.py). ``x_scale``
    (``[m, 1]`` fp32): ``x`` is already e4m3 (the producing norm quantized it); nothing is quantized here.
    Compiled one-row kernel only (more rows or the interpreter: refused): ``prefetch=(t, nbytes)``
    asks L2 for the first ``nbytes`` of tensor ``t`` (the next layer's weight) from the grid's last programs;
    ``pdl=True`` launches the kernel as a programmatic dependent launch; ``self_prefetch=True`` has each program
    ask L2 for its own weight rows first (Hopper+, fp8_prefetch.py). ``w_bits``: the one-row kernel's integer
    weight conversion (None: the module's ``W_BITS``); ignored (no effect on the result) for W8A16. ``reg_pf``: the
    one-row kernel's register prefetch of the next weight block (None: the module's ``REG_PF``; same result).
    ``acc_split`` (0, 8, 16; None: the module's ``ACC_SPLIT``): the one-row kernel sums each thread's runs of that
    many products first (fewer registers; fp32 sums in another order, so not bit-identical; overrides ``w_bits``).
    ``x2d`` (prequantized input only; None: the module's ``X2D``): the one-row kernel reads ``x`` in the weight
    tile's layout instead of broadcasting it through shared memory (no barrier per step; same result bit for bit).
    ``pdl_w`` (with ``pdl``; True = 1, or an int 1-4): the first ``pdl_w`` weight blocks (at most ``K // 1024``) are
    read before the kernel waits for its producer, and its dependents may launch once it has waited (same result
    bit for bit). ``amax_one`` (in-kernel quantization, one row; None: the module's ``AMAX_ONE``): the absmax reads
    the row with every load in flight at once (K <= AMAX_MAX_K; the same scale, the same result). ``loop2`` (0, 2 or 4;
    one row; None: the module's ``LOOP2``, whose None is the table's loop with the table's tile, else 0): the main
    loop loads that many weight blocks a trip (the same result). ``tail`` (one row, no bias; fp8_gemv_norm.py builds
    it): the RMSNorm after this linear and its quantization, by the grid's last program.
    """
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"fp8_gemv: weight {tuple(weight.shape)} (strides {weight.stride()}) does not fit x "
                         f"{tuple(x.shape)}; the weight must be [N, K] row-major")
    if x.stride(-1) != 1:
        x = x.contiguous()
    pre = x_scale is not None
    if pre and (x.dtype != torch.float8_e4m3fn or x_scale.numel() != m):
        raise ValueError(f"fp8_gemv: with x_scale, x must be float8_e4m3fn with one scale per row; got {x.dtype}, "
                         f"{x_scale.numel()} scales for {m} rows")
    y = torch.empty(m, n, dtype=out_dtype or (torch.bfloat16 if pre else x.dtype), device=x.device) \
        if tail is None or tail.get("y") is None else tail["y"]
    kernel, extra = _fp8_gemv_kernel, {}
    if tail is not None:  # the next RMSNorm by the last program (fp8_gemv_norm.py: its kernel, arguments, tile)
        if m != 1 or bias is not None or y.shape != (1, n):
            raise ValueError(f"fp8_gemv: tail (the norm after it) needs one row, no bias; {m} rows")
    if m == 0:
        return y
    ws = weight_scale.reshape(-1)
    soft = os.environ.get("TRITON_INTERPRET") == "1"
    pf_ptr, pf_total, pf_piece = weight, 0, 16
    if not 0 <= int(pdl_w) <= MAX_PDL_W:
        raise ValueError(f"fp8_gemv: pdl_w={pdl_w!r}: False/True or 0-{MAX_PDL_W} weight blocks before the wait")
    if prefetch is not None or pdl or self_prefetch:
        if m > 1 or soft:
            raise ValueError(f"fp8_gemv: prefetch / pdl / self_prefetch are for the compiled one-row kernel ({m} rows"
                             f"{', interpreter' if soft else ''})")
        if prefetch is not None:
            pf_ptr, pf_total, pf_piece = prefetch_args(*prefetch)
    args = (x, x_scale.reshape(-1) if pre else ws, weight, ws, bias, y, pf_ptr, pf_total, pf_piece, m, n, k,
            x.stride(0), weight.stride(0), y.stride(0))
    if tail is not None:
        more, extra = tail["args"](n, soft)
        args, kernel = (*args, *more), tail["kernel"]
    flags = dict(QUANT_X=quantize_input and not pre, PRE_Q=pre, HAS_BIAS=bias is not None)
    one_row_flags = {"W_BITS": True} if (W_BITS if w_bits is None else w_bits) and (pre or quantize_input) else {}
    if REG_PF if reg_pf is None else reg_pf:
        one_row_flags["REG_PF"] = True
    if pre and (X2D if x2d is None else x2d):
        one_row_flags["X2D"] = True
    trip = LOOP2 if loop2 is None else int(loop2)  # None: the table's, with the table's tile (below)
    if trip not in (None, 0, 2, 4):
        raise ValueError(f"fp8_gemv: loop2={loop2!r}: 0, 2 or 4 weight blocks a loop trip")
    if trip and not one_row_flags.get("REG_PF"):
        one_row_flags["LOOP2"] = trip
    if quantize_input and not pre and (AMAX_ONE if amax_one is None else amax_one) and k <= AMAX_MAX_K:
        one_row_flags["AMAX_KP"] = max(triton.next_power_of_2(k), AMAX_BLOCK.value)
    split = ACC_SPLIT if acc_split is None else acc_split
    if split:
        if split not in (8, 16):
            raise ValueError(f"fp8_gemv: acc_split={split}: 0, 8 or 16")
        one_row_flags.pop("W_BITS", None)  # the split accumulator takes the conversion path
        one_row_flags["ACC_SPLIT"] = split
    if pf_total or pdl or self_prefetch:
        pre_blocks = 0 if not (pdl and pdl_w) or one_row_flags.get("REG_PF") else min(int(pdl_w), max(k // 1024, 1))
        flags.update(PREFETCH=pf_total > 0, USE_PDL=pdl, SELF_PF=self_prefetch, PDL_W=pre_blocks,
                     **({"launch_pdl": True} if pdl else {}))
    if m > 1:  # several rows: one weight read for all of them (fp8_gemv_rows.py)
        from octavo.plugins.quant.fp8_gemv_rows import launch_rows

        launch_rows((*args[:6], *args[9:]), flags, m, n, k, soft)
        return y
    if soft:  # no timer to autotune with: one small tile
        kernel[(triton.cdiv(n, 16),)](*args, **flags, **one_row_flags, **extra, EVEN=False, SOFT_FP8=True,
                                      BLOCK_N=16, BLOCK_K=64)
        return y
    even = k % 1024 == 0 and n % 64 == 0
    if config is None:  # the measured tile (and main loop) for this card and shape
        config = fp8_gemv_tiles.table_tile(x.device, n, k, one_row_flags.get("ACC_SPLIT", 0))
        if config is not None and trip is None and not one_row_flags.get("REG_PF"):
            one_row_flags["LOOP2"] = fp8_gemv_tiles.table_loop(x.device, n, k)
        if config is None and tail is not None:  # the autotuner's tile for this shape: the unfused bits
            config = tail["tile"](n, k, pre, one_row_flags.get("ACC_SPLIT", 0), x.device)
    if config is not None:
        bn, bk, warps, *stages = config
        kernel[(triton.cdiv(n, bn),)](*args, **flags, **one_row_flags, **extra,
                                      EVEN=even and n % bn == 0 and k % bk == 0, SOFT_FP8=False, BLOCK_N=bn,
                                      BLOCK_K=bk, num_warps=warps, **dict(zip(("num_stages", "maxnreg"), stages)))
        return y
    tuned = _fp8_gemv_tuned_split if one_row_flags.get("ACC_SPLIT") else _fp8_gemv_tuned
    tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](*args, **flags, **one_row_flags, EVEN=even, SOFT_FP8=False)
    return y


def fp8_gemv_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       bias: torch.Tensor | None = None, *, quantize_input: bool = True) -> torch.Tensor:
    """float64 result of what :func:`fp8_gemv` computes (before its final rounding), for tests."""
    if quantize_input:  # fp8_triton.quantize_per_token_torch, written out (that module imports this one)
        s = (x.abs().amax(-1, keepdim=True).float() / 448.0).clamp(min=1e-12)
        q = (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        xd = q.double() * s.double()
    else:
        xd = x.double()
    y = xd @ (weight.double() * weight_scale.reshape(-1, 1).double()).t()
    return y + bias.double() if bias is not None else y
