"""Batch-1 MoE experts in ONE launch: routing, w13 + SiLU-and-mul, w2 + the weighted sum over the top k.

Why: the two-launch path (``moe_decode_kernels``) ends the w13 launch and starts the w2 launch at a grid boundary:
under PDL the w2 programs wait for the whole w13 grid to complete and flush (``griddepcontrol.wait``) before they
read anything. Here one grid does both. Each program first draws a ticket (``atomic_add``): the first
``G13 = k * cdiv(I, BN13)`` tickets are w13 tiles (``moe_decode_kernels._w13_route_kernel``'s arithmetic), the
next ``cdiv(H, BN2)`` are w2 tiles (``cuda_moe_w2_early``'s: the first ``PRE`` K-blocks of w2 loaded before
waiting). A w2 tile waits for a counter of finished w13 tiles to reach ``G13`` (acquire), then reads the
activations through L2 (``.cg``). Tickets go in the order programs run, so every w13 tile belongs to a program
that is already resident when any w2 program starts waiting: no deadlock, whatever the grid size or the card.
The last w2 tile resets the three counters, so a replayed CUDA graph needs no host work (as the one-launch
attention's tickets, ``moe_decode_attention``).

Same sums in the same order as the two-launch path with the same tiles, so the same bits. One counter triple per
device, shared by all layers: their launches run one after another on the stream. Under Triton's CPU interpreter
programs run one by one in order, so the w13 tiles are all done before the first w2 tile looks.
Chosen by the decode config's ``w2["ONE"]`` with ``w2["PRE"]`` >= 1 (opt-in; docs/moe.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_moe_route import _route
from octavo.plugins.platforms.cuda_moe_w2_early import MAX_PRE, _fma_w2, _load_w2
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

_COUNTERS: dict = {}


@triton.jit(do_not_specialize=["num_experts"])
def _moe_one_kernel(x_ptr, logits_ptr, w13_ptr, w2_ptr, act_ptr, out_ptr, weights_ptr, ids_ptr, cnt_ptr, num_experts,
                    INTER, H, s13_e, s13_n, s2_e, s2_n, TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr,
                    RENORMALIZE: tl.constexpr, BN13: tl.constexpr, BK13: tl.constexpr, BN2: tl.constexpr,
                    BK2: tl.constexpr, PRE: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # the router logits and x come from the previous launch
        gdc_wait()
        gdc_launch_dependents()
    t = tl.atomic_add(cnt_ptr, 1, sem="relaxed", scope="gpu")  # this program's tile, in the order programs run
    num_n13 = tl.cdiv(INTER, BN13)
    g13 = TOP_K * num_n13
    top_w, top_i = _route(logits_ptr, num_experts, TOP_K, K_P, E_P, RENORMALIZE, False)
    lanes = tl.arange(0, K_P)
    slot_ok = lanes < TOP_K
    dtype = out_ptr.dtype.element_ty
    if t == 0:  # the routing for the caller, as the w13 launch's program 0 writes it
        tl.store(weights_ptr + lanes, top_w, mask=slot_ok)
        tl.store(ids_ptr + lanes, top_i.to(tl.int64), mask=slot_ok)
    if t < g13:  # w13 tile: _w13_route_kernel's loop and roundings
        slot = t // num_n13
        expert = tl.sum(tl.where(lanes == slot, top_i, 0), axis=0).to(tl.int64)
        offs_n = (t % num_n13) * BN13 + tl.arange(0, BN13)
        n_ok = offs_n < INTER
        offs_k = tl.arange(0, BK13)
        b_ptrs = w13_ptr + expert * s13_e + offs_n.to(tl.int64)[:, None] * s13_n + offs_k[None, :]
        acc_g = tl.zeros([BN13, BK13], dtype=tl.float32)
        acc_u = tl.zeros([BN13, BK13], dtype=tl.float32)
        for k in range(0, tl.cdiv(H, BK13)):
            k_ok = offs_k < H - k * BK13
            a = tl.load(x_ptr + k * BK13 + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            g = tl.load(b_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            u = tl.load(b_ptrs + INTER * s13_n, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            acc_g += g * a[None, :]
            acc_u += u * a[None, :]
            b_ptrs += BK13
        gate = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)
        s = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        res = s * tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
        tl.store(act_ptr + slot * INTER + offs_n, res.to(dtype), mask=n_ok)
        tl.debug_barrier()  # every thread's act stores precede the count (released by the atomic)
        tl.atomic_add(cnt_ptr + 1, 1, sem="release", scope="gpu")
    else:  # w2 tile: cuda_moe_w2_early's loads and sums, the wait on the w13 count in place of the PDL wait
        pid_n = t - g13
        cols = pid_n * BN2 + tl.arange(0, BN2)
        cols_ok = cols < H
        ks = tl.arange(0, BK2)
        w2_ptrs = (w2_ptr + (top_i.to(tl.int64) * s2_e)[:, None, None] + (cols.to(tl.int64) * s2_n)[None, :, None]
                  + ks[None, None, :])
        rows_ok = slot_ok[:, None, None] & cols_ok[None, :, None]
        b0 = _load_w2(w2_ptrs, rows_ok, ks, INTER, 0, BK2)
        if PRE > 1:
            b1 = _load_w2(w2_ptrs, rows_ok, ks, INTER, 1, BK2)
        if PRE > 2:
            b2 = _load_w2(w2_ptrs, rows_ok, ks, INTER, 2, BK2)
        if PRE > 3:
            b3 = _load_w2(w2_ptrs, rows_ok, ks, INTER, 3, BK2)
        if PRE > 4:
            b4 = _load_w2(w2_ptrs, rows_ok, ks, INTER, 4, BK2)
        if PRE > 5:
            b5 = _load_w2(w2_ptrs, rows_ok, ks, INTER, 5, BK2)
        done = tl.atomic_add(cnt_ptr + 1, 0, sem="acquire", scope="gpu")
        while done < g13:
            done = tl.atomic_add(cnt_ptr + 1, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()  # no thread loads act before the acquire
        a_ptrs = act_ptr + (lanes * INTER)[:, None, None] + ks[None, None, :]
        acc = tl.zeros([K_P, BN2, BK2], dtype=tl.float32)
        acc = _fma_w2(acc, b0, a_ptrs, slot_ok, ks, INTER, 0, BK2, True)
        if PRE > 1:
            acc = _fma_w2(acc, b1, a_ptrs, slot_ok, ks, INTER, 1, BK2, True)
        if PRE > 2:
            acc = _fma_w2(acc, b2, a_ptrs, slot_ok, ks, INTER, 2, BK2, True)
        if PRE > 3:
            acc = _fma_w2(acc, b3, a_ptrs, slot_ok, ks, INTER, 3, BK2, True)
        if PRE > 4:
            acc = _fma_w2(acc, b4, a_ptrs, slot_ok, ks, INTER, 4, BK2, True)
        if PRE > 5:
            acc = _fma_w2(acc, b5, a_ptrs, slot_ok, ks, INTER, 5, BK2, True)
        for kb in range(PRE, tl.cdiv(INTER, BK2)):
            acc = _fma_w2(acc, _load_w2(w2_ptrs, rows_ok, ks, INTER, kb, BK2), a_ptrs, slot_ok, ks, INTER, kb, BK2,
                          True)
        y = tl.sum(acc, axis=2).to(dtype).to(tl.float32)
        w = top_w.to(dtype).to(tl.float32)
        terms = tl.where(slot_ok[:, None], (y * w[:, None]).to(dtype).to(tl.float32), 0.0)
        tl.store(out_ptr + cols, tl.sum(terms, axis=0).to(dtype), mask=cols_ok)
        tl.debug_barrier()
        fin = tl.atomic_add(cnt_ptr + 2, 1, sem="acq_rel", scope="gpu")
        if fin == tl.num_programs(0) - g13 - 1:  # the last tile: every program has drawn its ticket and is done
            tl.store(cnt_ptr, 0)
            tl.store(cnt_ptr + 1, 0)
            tl.store(cnt_ptr + 2, 0)


def _counters(device) -> torch.Tensor:
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(3, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def moe_one(x, router_logits, w13, w2, act, out, weights, ids, top_k: int, renormalize: bool, c13: dict, c2: dict,
            pre: int, launch_opts: dict) -> None:
    """One launch for ``decode_one``: writes ``act [k, I]``, ``out [1, H]``, the routing ``weights`` / ``ids``
    ``[1, k]`` (w13 tiles ``c13``, w2 tiles ``c2``,
    ``pre`` K-blocks of w2 loaded before the wait; one ``num_warps`` for both: ``c13``'s)."""
    if isinstance(pre, bool) or not isinstance(pre, int) or not 1 <= pre <= MAX_PRE:
        raise ValueError(f"decode_one: one PRE must be an int in 1..{MAX_PRE}, not {pre!r}")
    num_experts, two_i, hidden = w13.shape
    inter = two_i // 2
    grid = top_k * triton.cdiv(inter, c13["BLOCK_N"]) + triton.cdiv(hidden, c2["BLOCK_N"])
    _moe_one_kernel[(grid,)](
        x, router_logits, w13, w2, act, out, weights, ids, _counters(x.device), num_experts, inter, hidden, w13.stride(0),
        w13.stride(1), w2.stride(0), w2.stride(1), TOP_K=top_k, K_P=1 << max(0, top_k - 1).bit_length(),
        E_P=1 << max(0, num_experts - 1).bit_length(), RENORMALIZE=renormalize, BN13=c13["BLOCK_N"],
        BK13=c13["BLOCK_K"], BN2=c2["BLOCK_N"], BK2=c2["BLOCK_K"], PRE=pre, num_warps=c13.get("num_warps", 4),
        num_stages=c13.get("num_stages", 3), **launch_opts)
