"""Batch-1 MoE: the w2 + top-k sum launch that loads its first weight blocks before its PDL wait, taking the expert ids
from the w13 launch's program 0 through a flag (opt-in: the decode config's ``w2["EARLY"]`` = PRE, session 11).

Why: under PDL the w2 launch (``moe_decode_kernels._w2_sum_kernel``) becomes resident as the w13 launch's programs
retire, but waits for all of w13 before its first load (it reads the ids and the activations w13 writes), so HBM
idles over w13's tail, the wait's release and w2's first round trip (session 11 H100, PDL off: w13 73 % and w2 78 %
of the copy rate). Its weight rows depend only on the ids, which w13's program 0 writes right after routing, at the
start of w13. Session 9's early w2 recomputed the routing in each of its 1024 programs (111-178 registers) and lost
2-7 % on an H200. Here program 0 of w13 releases a flag after its ids and weights (``FLAG``), and each w2 program
polls it (acquire), reads the ids through L2 (``.cg``), loads its first ``PRE`` K-blocks of w2 rows, and only then
waits for the activations. No deadlock: a PDL successor starts only once every w13 program is running, so program 0
will set the flag; without PDL the flag is set before w2 starts. The last w2 program (a ticket) resets the flag and
the ticket for the next layer; the next w13 cannot pass its own wait before this w2 has finished (each kernel of the
chain waits for its predecessor before it lets its successor start).

The sums are ``_w2_sum_kernel``'s in the same order (preloaded blocks first, in order), so the output has its bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

MAX_PRE = 6  # K-blocks held across the wait (Qwen3-30B-A3B's I = 768 at BLOCK_K 128: all of them)


@triton.jit
def _blk(b_ptrs, rows_ok, offs_k, K, kb, BLOCK_K: tl.constexpr):
    k_ok = (offs_k < K - kb * BLOCK_K)[None, None, :]
    return tl.load(b_ptrs + kb * BLOCK_K, mask=rows_ok & k_ok, other=0.0)


@triton.jit
def _fma(acc, b, a_ptrs, slot_ok, offs_k, K, kb, BLOCK_K: tl.constexpr):
    k_ok = (offs_k < K - kb * BLOCK_K)[None, None, :]
    a = tl.load(a_ptrs + kb * BLOCK_K, mask=slot_ok[:, None, None] & k_ok, other=0.0).to(tl.float32)
    return acc + b.to(tl.float32) * a


@triton.jit
def _w2_early_kernel(act_ptr, w2_ptr, weights_ptr, ids_ptr, out_ptr, flag_ptr, N, K, stride_be, stride_bn,
                     TOP_K: tl.constexpr, K_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PRE: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu") == 0:  # w13's program 0 has written the ids
        pass
    tl.debug_barrier()  # no thread reads an id before the acquire
    lanes = tl.arange(0, K_P)
    slot_ok = lanes < TOP_K
    experts = tl.load(ids_ptr + lanes, mask=slot_ok, other=0, cache_modifier=".cg").to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = (w2_ptr + (experts * stride_be)[:, None, None] + (offs_n.to(tl.int64) * stride_bn)[None, :, None]
              + offs_k[None, None, :])
    rows_ok = slot_ok[:, None, None] & n_ok[None, :, None]
    b0 = _blk(b_ptrs, rows_ok, offs_k, K, 0, BLOCK_K)  # static ifs: the names stay in scope after them
    if PRE > 1:
        b1 = _blk(b_ptrs, rows_ok, offs_k, K, 1, BLOCK_K)
    if PRE > 2:
        b2 = _blk(b_ptrs, rows_ok, offs_k, K, 2, BLOCK_K)
    if PRE > 3:
        b3 = _blk(b_ptrs, rows_ok, offs_k, K, 3, BLOCK_K)
    if PRE > 4:
        b4 = _blk(b_ptrs, rows_ok, offs_k, K, 4, BLOCK_K)
    if PRE > 5:
        b5 = _blk(b_ptrs, rows_ok, offs_k, K, 5, BLOCK_K)
    if PDL:  # the activations come from the w13 launch
        gdc_wait()
        gdc_launch_dependents()
    a_ptrs = act_ptr + (lanes * K)[:, None, None] + offs_k[None, None, :]
    acc = tl.zeros([K_P, BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc = _fma(acc, b0, a_ptrs, slot_ok, offs_k, K, 0, BLOCK_K)
    if PRE > 1:
        acc = _fma(acc, b1, a_ptrs, slot_ok, offs_k, K, 1, BLOCK_K)
    if PRE > 2:
        acc = _fma(acc, b2, a_ptrs, slot_ok, offs_k, K, 2, BLOCK_K)
    if PRE > 3:
        acc = _fma(acc, b3, a_ptrs, slot_ok, offs_k, K, 3, BLOCK_K)
    if PRE > 4:
        acc = _fma(acc, b4, a_ptrs, slot_ok, offs_k, K, 4, BLOCK_K)
    if PRE > 5:
        acc = _fma(acc, b5, a_ptrs, slot_ok, offs_k, K, 5, BLOCK_K)
    for kb in range(PRE, tl.cdiv(K, BLOCK_K)):
        acc = _fma(acc, _blk(b_ptrs, rows_ok, offs_k, K, kb, BLOCK_K), a_ptrs, slot_ok, offs_k, K, kb, BLOCK_K)
    dtype = out_ptr.dtype.element_ty
    y = tl.sum(acc, axis=2).to(dtype).to(tl.float32)  # [K_P, BLOCK_N]: as _w2_sum_kernel
    w = tl.load(weights_ptr + lanes, mask=slot_ok, other=0.0, cache_modifier=".cg").to(dtype).to(tl.float32)
    terms = tl.where(slot_ok[:, None], (y * w[:, None]).to(dtype).to(tl.float32), 0.0)
    tl.store(out_ptr + offs_n, tl.sum(terms, axis=0).to(dtype), mask=n_ok)
    tl.debug_barrier()  # every thread past the flag before the ticket
    ticket = tl.atomic_add(flag_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:  # the last program: reset the flag and the ticket for the next layer
        tl.store(flag_ptr, 0)
        tl.store(flag_ptr + 1, 0)


_FLAGS: dict = {}  # one (flag, ticket) pair per device, shared by every layer (each w2 launch resets it)


def flags(dev: torch.device) -> torch.Tensor:
    key = (dev.type, dev.index)
    if key not in _FLAGS:
        _FLAGS[key] = torch.zeros(2, dtype=torch.int32, device=dev)
    return _FLAGS[key]


def check_early(cfg: dict) -> int:
    """The decode config's ``w2["EARLY"]`` (0 = the plain w2 launch), or a ValueError naming what is wrong."""
    pre = cfg.get("EARLY", 0)
    if isinstance(pre, bool) or not isinstance(pre, int) or not 0 <= pre <= MAX_PRE:
        raise ValueError(f"decode_one: w2 EARLY must be an int in 0..{MAX_PRE}, not {pre!r}")
    if pre and cfg.get("PF_NEXT", 0):
        raise ValueError("decode_one: w2 EARLY and PF_NEXT are separate variants; set one of them")
    return pre


def launch_w2_early(act, w2, weights, ids, out, top_k: int, cfg: dict, launch: dict) -> None:
    """:func:`_w2_early_kernel` for ``decode_one`` (the w13 launch ran with ``FLAG``; ``cfg`` = the ``w2`` part)."""
    num_experts, hidden, inter = w2.shape
    _w2_early_kernel[(triton.cdiv(hidden, cfg["BLOCK_N"]),)](
        act, w2, weights, ids, out, flags(act.device), hidden, inter, w2.stride(0), w2.stride(1), TOP_K=top_k,
        K_P=1 << max(0, top_k - 1).bit_length(), BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], PRE=cfg["EARLY"],
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3), **launch)
