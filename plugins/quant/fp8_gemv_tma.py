"""The one-row fp8 GEMV with its weight blocks streamed by TMA through shared memory (session 16, engineer fp816;
``OCTAVO_FP8_GEMV_TMA``: the pipeline's depth for o_proj / down on an H100, 0 = off (default until measured)).

Why: at one row the 8B forward's o_proj and down run the table's 16x1024 8-warp tile with two weight blocks a loop
trip (fp8_gemv_tiles.py): 155-255 registers a thread, one program an SM, 32 KB in flight, then the math, then the
next two blocks. Their critical path is 55 / 71 us a forward above their weight time at the copy rate (session 15);
gate_up and qkv (six 4x1024 programs an SM) are at it. Here the weight blocks come through Triton's pipelined
tensor-descriptor loads (``cp.async.bulk.tensor`` into ``STAGES`` shared-memory buffers with mbarriers, sm_90): the
next ``STAGES - 1`` blocks are in flight during each block's math, without registers (sm_90 SASS, Triton 3.6 / 3.9:
~50 registers for the loop, so the programs also fit beside the kernel in front of them).

What stays the same (so the same bits): the first weight block read into registers before the PDL wait, the row's
absmax with every load in flight (``AMAX_KP``), and every block's math through fp8_gemv's own ``_gemv_step`` (the
split accumulator) in the same order; the block read from shared memory lands in the register layout the plain load
has (sm_90 TTGIR: ``sizePerThread [1, 16]``, the same reduction layouts). Only the one-row, no-bias, prefetch-free
launch with the table's tile, ``EVEN`` shapes and the split accumulator takes it (``applies``); everything else runs
fp8_gemv's kernel as before.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_int, env_switch
from octavo.plugins.quant import fp8_gemv as _plain
from octavo.plugins.quant.fp8_gemv import AMAX_BLOCK, _gemv_step
from octavo.plugins.quant.fp8_gemv_l2 import _prefetch_rows_once

#: the pipeline's depth (shared-memory buffers; 2-4), 0 = off. ``OCTAVO_FP8_GEMV_TMA``
STAGES = env_int("OCTAVO_FP8_GEMV_TMA", 0, 0, 4)
#: weight blocks asked of L2 before the PDL wait instead of the first block into registers (0 = the register block,
#: as fp8_gemv; 1-3). ``OCTAVO_FP8_GEMV_TMA_L2``
L2_BLOCKS = env_int("OCTAVO_FP8_GEMV_TMA_L2", 0, 0, 3)
#: down_proj's absmax from the SiLU kernel's pieces (fp8_silu_amax.py; the same scale). ``OCTAVO_FP8_GEMV_TMA_AMAX``
AMAX_FROM_PRODUCER = env_switch("OCTAVO_FP8_GEMV_TMA_AMAX", default=False)
#: the shapes ``(N, K)`` it takes (o_proj and down of the 8B shape: the table's 16x1024 8-warp tile)
SHAPES = {(4096, 4096), (4096, 14336)}


@triton.jit
def _x_piece(x_ptr, k, K):
    ka = k + tl.arange(0, AMAX_BLOCK)
    return tl.load(x_ptr + ka, mask=ka < K, other=0.0).to(tl.float32)


@triton.jit
def _fp8_gemv_tma_kernel(x_ptr, xs_ptr, w_desc, w_ptr, ws_ptr, y_ptr, K, stride_wn, n_parts, QUANT_X: tl.constexpr,
                         PRE_Q: tl.constexpr, SOFT_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         ACC_SPLIT: tl.constexpr, AMAX_KP: tl.constexpr, USE_PDL: tl.constexpr, PDL_W: tl.constexpr,
                         STAGES_: tl.constexpr, L2PF: tl.constexpr = 0, PARTS_P: tl.constexpr = 0):
    """``y[n] = (sum_k q(x[k]) * W[n, k]) * s_x * s_w[n]`` for one row: fp8_gemv's one-row kernel (``EVEN``, split
    accumulator) with blocks ``PDL_W..`` from TMA (module docstring). ``L2PF`` (with ``PDL_W`` 0): each row's first
    ``L2PF`` blocks are asked of L2 (one bulk prefetch a row) before the wait, instead of block 0 into registers: the
    pipeline's first copies, issued right after the absmax, then hit L2 (with a register block first, its math sits
    between the absmax and the copies: sm_90 PTX). ``PARTS_P`` (with ``QUANT_X``): the row's absmax is the max of the
    ``n_parts`` pieces its producer stored at ``xs_ptr`` (fp8_silu_amax.py): one small load instead of the row's."""
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    ws = tl.load(ws_ptr + n)
    if L2PF and not SOFT_FP8:  # no kernel writes the weight: safe before the wait (one request a row)
        _prefetch_rows_once(w_ptr, pid * BLOCK_N, stride_wn, L2PF * BLOCK_K, BLOCK_N)
    if PDL_W:
        w_first = tl.load(rows + tl.arange(0, BLOCK_K)[None, :])
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if PDL_W or L2PF:  # as fp8_gemv with its first block early: the next kernel may launch now
            tl.extra.cuda.gdc_launch_dependents()
    # what the scale needs is asked for here and used in the loop's first trip: the pipeline's first copies are issued
    # before anything waits for these loads (sm_90 PTX: no barrier and no math between the wait and the copies)
    if PRE_Q:
        xs = tl.load(xs_ptr)
    if QUANT_X and PARTS_P > 0:
        pa = tl.arange(0, PARTS_P)
        parts = tl.load(xs_ptr + pa, mask=pa < n_parts, other=0.0)
    elif QUANT_X:  # fp8_gemv's unrolled absmax: every load in flight at once (AMAX_KP <= 8 blocks)
        va0 = _x_piece(x_ptr, 0, K)
        if AMAX_KP > AMAX_BLOCK:
            va1 = _x_piece(x_ptr, AMAX_BLOCK, K)
        if AMAX_KP > 2 * AMAX_BLOCK:
            va2 = _x_piece(x_ptr, 2 * AMAX_BLOCK, K)
            va3 = _x_piece(x_ptr, 3 * AMAX_BLOCK, K)
        if AMAX_KP > 4 * AMAX_BLOCK:
            va4 = _x_piece(x_ptr, 4 * AMAX_BLOCK, K)
            va5 = _x_piece(x_ptr, 5 * AMAX_BLOCK, K)
            va6 = _x_piece(x_ptr, 6 * AMAX_BLOCK, K)
            va7 = _x_piece(x_ptr, 7 * AMAX_BLOCK, K)
    acc = tl.zeros([BLOCK_N, BLOCK_K // ACC_SPLIT], dtype=tl.float32)
    s_x = 1.0
    k0 = BLOCK_K if PDL_W else 0
    for k in tl.range(k0, K, BLOCK_K, num_stages=STAGES_):
        w = w_desc.load([pid * BLOCK_N, k])
        if k == k0:  # the first trip: the scale, then block 0 if it came in registers (the same order of blocks)
            if PRE_Q:
                s_x = xs
            if QUANT_X and PARTS_P > 0:  # the producer's pieces of the absmax: the same max, the same scale
                s_x = tl.maximum(tl.math.div_rn(tl.max(parts, axis=0), 448.0), 1e-12)
            elif QUANT_X:
                amax1 = tl.abs(va0)
                if AMAX_KP > AMAX_BLOCK:
                    amax1 = tl.maximum(amax1, tl.abs(va1))
                if AMAX_KP > 2 * AMAX_BLOCK:
                    amax1 = tl.maximum(tl.maximum(amax1, tl.abs(va2)), tl.abs(va3))
                if AMAX_KP > 4 * AMAX_BLOCK:
                    amax1 = tl.maximum(tl.maximum(amax1, tl.abs(va4)), tl.abs(va5))
                    amax1 = tl.maximum(tl.maximum(amax1, tl.abs(va6)), tl.abs(va7))
                s_x = tl.maximum(tl.math.div_rn(tl.max(amax1, axis=0), 448.0), 1e-12)
            if PDL_W:
                acc = _gemv_step(acc, w_first, x_ptr, tl.arange(0, BLOCK_K), s_x, K, QUANT_X, PRE_Q, True, SOFT_FP8,
                                 False, False, ACC_SPLIT, BLOCK_N, BLOCK_K)
        acc = _gemv_step(acc, w, x_ptr, k + tl.arange(0, BLOCK_K), s_x, K, QUANT_X, PRE_Q, True, SOFT_FP8, False,
                         False, ACC_SPLIT, BLOCK_N, BLOCK_K)
    y = (tl.sum(acc, 1) * s_x * ws).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + n, y)


_DESC: dict = {}


def _descriptor(weight: torch.Tensor, bn: int, bk: int):
    """The weight's TMA descriptor, built once per weight and tile (it holds the weight: a model's weights live as
    long as it does; a new tensor at the same address replaces the entry)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    key = (weight.data_ptr(), tuple(weight.shape), bn, bk)
    hit = _DESC.get(key)
    if hit is None or hit.base is not weight:
        hit = _DESC[key] = TensorDescriptor.from_tensor(weight, [bn, bk])
    return hit


def applies(m: int, n: int, k: int, flags: dict, one_row: dict, config, bias, tail, pf_total: int, self_pf: bool,
            stages: int | None = None) -> bool:
    """Whether fp8_gemv's launch may go to this kernel (the module docstring's conditions)."""
    depth = STAGES if stages is None else stages
    if not depth or m != 1 or (n, k) not in SHAPES or bias is not None or tail is not None or pf_total or self_pf:
        return False
    if config is None or k % config[1] or n % config[0] or k % 1024:
        return False
    if flags.get("QUANT_X") and not one_row.get("AMAX_KP"):  # the in-flight absmax only (fp8_gemv's AMAX_ONE)
        return False
    return (one_row.get("ACC_SPLIT", 0) > 0 and not one_row.get("REG_PF") and not one_row.get("X2D")
            and not one_row.get("W_BITS") and not flags.get("PREFETCH") and not flags.get("SELF_PF")
            and int(flags.get("PDL_W", 0)) <= 1)


def launch(x, x_scale, weight, ws, y, flags: dict, one_row: dict, config, soft: bool, stages: int | None = None,
           l2_blocks: int | None = None, x_amax: torch.Tensor | None = None):
    """Run the TMA kernel for fp8_gemv's one-row launch (its ``flags`` / ``one_row_flags`` / tile). ``x_amax``: the
    producer's pieces of the row's absmax (fp8_silu_amax.py; used with in-kernel quantization)."""
    parts = x_amax.numel() if x_amax is not None and flags["QUANT_X"] and AMAX_FROM_PRODUCER else 0
    n, k = weight.shape
    bn, bk, warps, *_ = config
    if k < 2 * bk or (flags["QUANT_X"] and not (one_row.get("AMAX_KP") or x_amax is not None)):
        raise ValueError(f"fp8_gemv_tma: K={k} needs two blocks of {bk} and in-kernel quantization its AMAX_KP")
    desc = _descriptor(weight, bn, bk)
    l2 = (L2_BLOCKS if l2_blocks is None else l2_blocks) if flags.get("USE_PDL") and not soft else 0
    extra = {"launch_pdl": True} if flags.get("USE_PDL") else {}
    _fp8_gemv_tma_kernel[(triton.cdiv(n, bn),)](
        x, x_amax if parts else (x_scale if x_scale is not None else ws), desc, weight, ws, y, k, weight.stride(0),
        parts,
        QUANT_X=flags["QUANT_X"], PRE_Q=flags["PRE_Q"], SOFT_FP8=soft, BLOCK_N=bn, BLOCK_K=bk,
        ACC_SPLIT=one_row["ACC_SPLIT"], AMAX_KP=one_row.get("AMAX_KP", 0), USE_PDL=bool(flags.get("USE_PDL")),
        PDL_W=0 if l2 else int(flags.get("PDL_W", 0)), STAGES_=STAGES if stages is None else stages,
        L2PF=l2, PARTS_P=triton.next_power_of_2(parts) if parts else 0, num_warps=warps, num_stages=1, **extra)
    return y


if launch not in [run for _, run in _plain.ALT_ONE_ROW]:  # fp8_gemv asks it first (``applies``)
    _plain.ALT_ONE_ROW.append((applies, launch))
