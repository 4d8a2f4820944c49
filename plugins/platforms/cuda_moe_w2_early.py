"""Batch-1 MoE: the w2 + top-k sum launch that starts streaming its weights before the w13 launch ends.

Why: the session-8 profile of Qwen3-30B-A3B at batch 1 (H100, PDL off) has the two expert launches at 73% (w13)
and 78% (w2) of the copy rate. Under PDL the w2 launch (``moe_decode_kernels._w2_sum_kernel``) starts early but
waits (``gdc_wait``) before its first load: it reads the expert ids that the w13 launch writes, so HBM idles over
the w13 launch's tail, over the wait's release, and over w2's first round trip. Yet w2's weight rows depend only
on the routing, and the routing depends only on the router logits, which were complete before the w13 launch
passed its own wait (``cuda_pdl``: whatever ran before a kernel's predecessor is complete when it starts). So each
program here recomputes the routing itself (``cuda_moe_route._route``: the w13 launch's arithmetic, so the
same ids and weights bit for bit; the logits read through L2, ``.cg``), loads its first ``PRE`` K-blocks of w2
rows, and only then waits for the activations. Programs that become resident while w13 still runs (as its
programs retire) have those bytes in flight across the wait.

The sums are ``_w2_sum_kernel``'s, in the same order (the preloaded blocks are consumed first, in order, then
the loop goes on from block ``PRE``), so the output is bit-equal to the two-launch path's with the same tiles.
Chosen by the decode config's ``w2["PRE"]`` (1..``MAX_PRE``; 0 = the plain kernel); see docs/moe.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_moe_route import _route
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

MAX_PRE = 6  # K-blocks held in registers across the wait (Qwen3-30B-A3B's I=768 at BLOCK_K 128: all of them)


@triton.jit
def _load_w2(b_ptrs, rows_ok, offs_k, K, kb, BLOCK_K: tl.constexpr):
    """K-block ``kb`` of this program's ``[K_P, BLOCK_N, BLOCK_K]`` w2 tile (zeros past K)."""
    k_ok = (offs_k < K - kb * BLOCK_K)[None, None, :]
    return tl.load(b_ptrs + kb * BLOCK_K, mask=rows_ok & k_ok, other=0.0)


@triton.jit
def _fma_w2(acc, b, a_ptrs, slot_ok, offs_k, K, kb, BLOCK_K: tl.constexpr, CG: tl.constexpr):
    """``acc += b * act`` for K-block ``kb``: the loop body of ``_w2_sum_kernel`` (``CG``: act through L2, ``.cg``:
    written by other programs of the same launch, cuda_moe_one_launch.py). No defaults: see ``_route``."""
    k_ok = (offs_k < K - kb * BLOCK_K)[None, None, :]
    if CG:
        a = tl.load(a_ptrs + kb * BLOCK_K, mask=slot_ok[:, None, None] & k_ok, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
    else:
        a = tl.load(a_ptrs + kb * BLOCK_K, mask=slot_ok[:, None, None] & k_ok, other=0.0).to(tl.float32)
    return acc + b.to(tl.float32) * a


@triton.jit(do_not_specialize=["num_experts"])
def _w2_early_kernel(act_ptr, w2_ptr, logits_ptr, out_ptr, num_experts, N, K, stride_be, stride_bn,
                     TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr, RENORMALIZE: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE: tl.constexpr, PDL: tl.constexpr = False):
    """``out[n] = sum_j weight[j] * (act[j] . w2[ids[j], n])`` over this program's ``BLOCK_N`` columns, with the
    routing and the first ``PRE`` (>= 1) K-blocks of w2 loaded before the PDL wait."""
    pid_n = tl.program_id(0)
    top_w, top_i = _route(logits_ptr, num_experts, TOP_K, K_P, E_P, RENORMALIZE, True)
    lanes = tl.arange(0, K_P)
    slot_ok = lanes < TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = (w2_ptr + (top_i.to(tl.int64) * stride_be)[:, None, None]
              + (offs_n.to(tl.int64) * stride_bn)[None, :, None] + offs_k[None, None, :])
    rows_ok = slot_ok[:, None, None] & n_ok[None, :, None]
    b0 = _load_w2(b_ptrs, rows_ok, offs_k, K, 0, BLOCK_K)  # static ifs: the names stay in scope after them
    if PRE > 1:
        b1 = _load_w2(b_ptrs, rows_ok, offs_k, K, 1, BLOCK_K)
    if PRE > 2:
        b2 = _load_w2(b_ptrs, rows_ok, offs_k, K, 2, BLOCK_K)
    if PRE > 3:
        b3 = _load_w2(b_ptrs, rows_ok, offs_k, K, 3, BLOCK_K)
    if PRE > 4:
        b4 = _load_w2(b_ptrs, rows_ok, offs_k, K, 4, BLOCK_K)
    if PRE > 5:
        b5 = _load_w2(b_ptrs, rows_ok, offs_k, K, 5, BLOCK_K)
    if PDL:  # the activations come from the w13 launch
        gdc_wait()
        gdc_launch_dependents()
    a_ptrs = act_ptr + (lanes * K)[:, None, None] + offs_k[None, None, :]
    acc = tl.zeros([K_P, BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc = _fma_w2(acc, b0, a_ptrs, slot_ok, offs_k, K, 0, BLOCK_K, False)
    if PRE > 1:
        acc = _fma_w2(acc, b1, a_ptrs, slot_ok, offs_k, K, 1, BLOCK_K, False)
    if PRE > 2:
        acc = _fma_w2(acc, b2, a_ptrs, slot_ok, offs_k, K, 2, BLOCK_K, False)
    if PRE > 3:
        acc = _fma_w2(acc, b3, a_ptrs, slot_ok, offs_k, K, 3, BLOCK_K, False)
    if PRE > 4:
        acc = _fma_w2(acc, b4, a_ptrs, slot_ok, offs_k, K, 4, BLOCK_K, False)
    if PRE > 5:
        acc = _fma_w2(acc, b5, a_ptrs, slot_ok, offs_k, K, 5, BLOCK_K, False)
    for kb in range(PRE, tl.cdiv(K, BLOCK_K)):
        acc = _fma_w2(acc, _load_w2(b_ptrs, rows_ok, offs_k, K, kb, BLOCK_K), a_ptrs, slot_ok, offs_k, K, kb,
                      BLOCK_K, False)
    dtype = out_ptr.dtype.element_ty
    y = tl.sum(acc, axis=2).to(dtype).to(tl.float32)  # [K_P, BLOCK_N]: as _w2_sum_kernel, rounded like torch
    w = top_w.to(dtype).to(tl.float32)
    terms = tl.where(slot_ok[:, None], (y * w[:, None]).to(dtype).to(tl.float32), 0.0)
    tl.store(out_ptr + offs_n, tl.sum(terms, axis=0).to(dtype), mask=n_ok)


def check_pre(cfg: dict) -> int:
    """The decode config's ``w2["PRE"]`` (0 = the plain w2 launch), or a ValueError naming what is wrong."""
    pre = cfg.get("PRE", 0)
    if isinstance(pre, bool) or not isinstance(pre, int) or not 0 <= pre <= MAX_PRE:
        raise ValueError(f"decode_one: w2 PRE must be an int in 0..{MAX_PRE}, not {pre!r}")
    if pre and cfg.get("PF_NEXT", 0):
        raise ValueError("decode_one: w2 PRE and PF_NEXT are separate variants; set one of them")
    return pre


def launch_w2_early(act, w2, router_logits, out, top_k: int, renormalize: bool, cfg: dict, launch_opts: dict) -> None:
    """Run :func:`_w2_early_kernel` for ``decode_one`` (``cfg`` = the decode config's ``w2`` part, ``PRE`` in
    1..MAX_PRE, checked by :func:`check_pre`; ``act [k, I]``, ``router_logits [1, E]`` contiguous)."""
    pre = cfg["PRE"]
    num_experts, hidden, inter = w2.shape
    k_p = 1 << max(0, top_k - 1).bit_length()
    e_p = 1 << max(0, num_experts - 1).bit_length()
    _w2_early_kernel[(triton.cdiv(hidden, cfg["BLOCK_N"]),)](
        act, w2, router_logits, out, num_experts, hidden, inter, w2.stride(0), w2.stride(1), TOP_K=top_k, K_P=k_p,
        E_P=e_p, RENORMALIZE=renormalize, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], PRE=pre,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3), **launch_opts)
