"""Batch-1 (one token) MoE decode in two Triton launches: routing fused into the w13 GEMV, and the top-k
weighted sum fused into the w2 GEMV.

Why: at batch 1 the general fused kernel (``cuda_moe_kernels``) runs four launches per layer after the router
GEMV (routing, w13, w2, the sum over k) and pads every slot to a 16-row ``tl.dot`` tile. Each launch inside a
CUDA graph costs 2-4 us, which on Qwen3-30B-A3B (48 MoE layers, 26 us of expert bytes per layer) is a large
part of a decode step. Here:

1. :func:`_w13_route_kernel`, grid ``k * cdiv(I, BLOCK_N)``: every program recomputes the token's routing from
   the ``[E]`` router logits (float32 softmax, top-k by k rounds of argmax with the lowest index winning a tie,
   optional renormalisation: the same arithmetic as ``topk_softmax``; E <= a few hundred lanes, cheap), takes
   the expert of its slot, and streams that expert's gate and up rows as a GEMV (plain loads and fp32
   products, no ``tl.dot``: no padded rows). It writes ``silu(gate) * up`` rounded where the torch path
   rounds; program 0 also writes the routing weights and ids for the second launch.
2. :func:`_w2_sum_kernel`, grid ``cdiv(H, BLOCK_N)``: each program owns ``BLOCK_N`` output columns of all k
   slots and loops over the intermediate dimension, so the weighted sum over k happens in registers: no
   ``[k, H]`` intermediate, no separate sum launch, no cross-program reduction. Per slot the GEMV result is
   rounded to the model dtype, multiplied by the routing weight rounded to the dtype, rounded again (as the
   torch path and the general kernel do), and the k terms are summed in fp32 and rounded once (as
   ``torch.sum`` of the general kernel's slot outputs).

So one token's MoE block is router GEMV + these two launches. Same weight bytes as the general path. Not
used under expert parallelism (ids of other ranks) or for more than one token. Both take part in programmatic
dependent launch when ``cuda_pdl`` has it on (opt-in ``OCTAVO_PDL=1``): they wait for their producer first
(nothing can load before the routing is known), then let their successor launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_moe_route import _route, _route_slot, _route_store
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts
from octavo.plugins.platforms.moe_prefetch import as_bytes, l2_prefetch, prefetch_split
from octavo.plugins.platforms.moe_w2_early import check_early, launch_w2_early
from octavo.plugins.platforms.moe_w2_early import flags as w2_flags


@triton.jit
def _route_rank(logits_ptr, num_experts, slot, TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr,
                RENORMALIZE: tl.constexpr, CH: tl.constexpr):
    """:func:`_route`'s choice by ranks instead of k rounds of a block-wide max: ``rank[e]`` = how many keys beat
    expert e's (the same int64 keys), counted over ``CH``-expert chunks whose keys are recomputed from the logits
    (the same arithmetic, so the same bits); the slot's expert is the one of rank ``slot``. Returns (weights [K_P],
    ids [K_P], the slot's expert): lanes by rank, as :func:`_route` orders them, so the renormalising sum adds the
    same values in the same lane order."""
    experts = tl.arange(0, E_P)
    ok = experts < num_experts
    x = tl.load(logits_ptr + experts, mask=ok, other=-float("inf")).to(tl.float32)
    mx = tl.max(x, axis=0)
    p = tl.exp(x - mx)
    tot = tl.sum(tl.where(ok, p, 0.0), axis=0)
    p = p / tot
    key = tl.where(ok, (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E_P - 1 - experts).to(tl.int64), -1)
    rank = tl.zeros([E_P], dtype=tl.int32)
    for c in tl.static_range(E_P // CH):
        ec = c * CH + tl.arange(0, CH)
        okc = ec < num_experts
        pc = tl.exp(tl.load(logits_ptr + ec, mask=okc, other=-float("inf")).to(tl.float32) - mx) / tot
        kc = tl.where(okc, (pc.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E_P - 1 - ec).to(tl.int64), -1)
        rank += tl.sum((kc[None, :] > key[:, None]).to(tl.int32), axis=1)
    rank = tl.where(ok, rank, E_P)
    lanes = tl.arange(0, K_P)
    hit = rank[None, :] == lanes[:, None]  # [K_P, E_P]: lane j holds the expert of rank j
    top_w = tl.sum(tl.where(hit, p[None, :], 0.0), axis=1)
    top_i = tl.sum(tl.where(hit, experts[None, :], 0), axis=1)
    top_w = tl.where(lanes < TOP_K, top_w, 0.0)
    top_i = tl.where(lanes < TOP_K, top_i, 0)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)
    expert = tl.sum(tl.where(rank == slot, experts, 0), axis=0)
    return top_w, top_i, expert


@triton.jit(do_not_specialize=["num_experts"])
def _w13_route_kernel(x_ptr, logits_ptr, w13_ptr, act_ptr, weights_ptr, ids_ptr, num_experts, N, K,
                      stride_be, stride_bn, w2_ptr, w2_bytes, w2_piece, pf_ptr, pf_total, pf_piece, flag_ptr,
                      TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr, RENORMALIZE: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
                      PF_W2: tl.constexpr = False, EVICT: tl.constexpr = "", ROUTE_IN: tl.constexpr = True,
                      PF_NEXT: tl.constexpr = False, PIPE: tl.constexpr = False, RANK: tl.constexpr = False,
                      RANK_CH: tl.constexpr = 16, FLAG: tl.constexpr = False, PARTIAL: tl.constexpr = False):
    """``act[slot, n] = silu(x . w1[e, n]) * (x . w3[e, n])`` for the token's slot ``pid // cdiv(N, BLOCK_N)``.

    ``PF_W2`` (moe_prefetch.py): once its expert is known, each program asks L2 for its share of that expert's
    ``w2`` bytes (``w2_bytes`` per expert at ``w2_ptr``, split over the slot's programs), so the w2 launch reads
    L2. ``EVICT``: the eviction policy of the streamed w13 loads ("evict_first" keeps the prefetched w2 in L2).
    ``ROUTE_IN`` False: the routing ran as its own launch before (``topk_softmax``); read the slot's id.
    ``PF_NEXT``: before its PDL wait (while the norm and router run and HBM idles) the grid asks L2 for
    ``pf_total`` bytes at ``pf_ptr`` (the next layer's qkv weight). ``PIPE``: the next K-block's loads are issued
    before this block's products (twice the bytes in flight per program; the same sums in the same order)."""
    pid = tl.program_id(0)
    if PF_NEXT:
        l2_prefetch(pf_ptr, pf_total, pf_piece, pid, 2)
    if PDL:  # cuda_pdl.py (OCTAVO_PDL=1): nothing to load before the logits exist (the expert depends on them)
        gdc_wait()
        gdc_launch_dependents()
    num_n = tl.cdiv(N, BLOCK_N)
    slot = pid // num_n
    pid_n = pid % num_n
    if ROUTE_IN and RANK:  # ROUTE "rank": by ranks, fewer block-wide reductions before the first weight load
        top_w, top_i, expert = _route_rank(logits_ptr, num_experts, slot, TOP_K, K_P, E_P, RENORMALIZE, RANK_CH)
        expert = expert.to(tl.int64)
        lanes = tl.arange(0, K_P)
        if pid == 0:
            tl.store(weights_ptr + lanes, top_w, mask=lanes < TOP_K)
            tl.store(ids_ptr + lanes, top_i.to(tl.int64), mask=lanes < TOP_K)
    elif ROUTE_IN and PARTIAL:  # ROUTE "partial": slot s runs s + 1 rounds; program 0 all k (it stores them)
        if pid == 0:
            top_w, top_i = _route(logits_ptr, num_experts, TOP_K, K_P, E_P, RENORMALIZE)
            lanes = tl.arange(0, K_P)
            tl.store(weights_ptr + lanes, top_w, mask=lanes < TOP_K)
            tl.store(ids_ptr + lanes, top_i.to(tl.int64), mask=lanes < TOP_K)
            expert = tl.sum(tl.where(lanes == slot, top_i, 0), axis=0).to(tl.int64)
        else:
            expert = _route_slot(logits_ptr, num_experts, slot, E_P)
    elif ROUTE_IN:
        expert = _route_store(logits_ptr, weights_ptr, ids_ptr, num_experts, pid, slot, TOP_K, K_P, E_P, RENORMALIZE)
    else:
        expert = tl.load(ids_ptr + slot)
    if FLAG:  # moe_w2_early.py: the ids and weights are in memory; the early w2 launch may read them
        if pid == 0:
            tl.debug_barrier()
            tl.atomic_xchg(flag_ptr, 1, sem="release", scope="gpu")
    if PF_W2:
        l2_prefetch(w2_ptr + expert * w2_bytes, w2_bytes, w2_piece, pid_n, 4)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = w13_ptr + expert * stride_be + offs_n.to(tl.int64)[:, None] * stride_bn + offs_k[None, :]
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if PIPE:
        k_ok = offs_k < K
        a = tl.load(x_ptr + offs_k, mask=k_ok, other=0.0)
        g = tl.load(b_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy=EVICT)
        u = tl.load(b_ptrs + N * stride_bn, mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy=EVICT)
        for k in range(1, tl.cdiv(K, BLOCK_K)):
            b_ptrs += BLOCK_K
            k_ok = offs_k < K - k * BLOCK_K
            a_n = tl.load(x_ptr + k * BLOCK_K + offs_k, mask=k_ok, other=0.0)
            g_n = tl.load(b_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy=EVICT)
            u_n = tl.load(b_ptrs + N * stride_bn, mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                          eviction_policy=EVICT)
            acc_g += g.to(tl.float32) * a.to(tl.float32)[None, :]
            acc_u += u.to(tl.float32) * a.to(tl.float32)[None, :]
            a, g, u = a_n, g_n, u_n
        acc_g += g.to(tl.float32) * a.to(tl.float32)[None, :]
        acc_u += u.to(tl.float32) * a.to(tl.float32)[None, :]
    else:
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(x_ptr + k * BLOCK_K + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            g = tl.load(b_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                        eviction_policy=EVICT).to(tl.float32)
            u = tl.load(b_ptrs + N * stride_bn, mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                        eviction_policy=EVICT).to(tl.float32)
            acc_g += g * a[None, :]
            acc_u += u * a[None, :]
            b_ptrs += BLOCK_K
    dtype = act_ptr.dtype.element_ty
    gate = tl.sum(acc_g, axis=1).to(dtype).to(tl.float32)  # round like the torch path: gate/up, silu, product
    s = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    res = s * tl.sum(acc_u, axis=1).to(dtype).to(tl.float32)
    tl.store(act_ptr + slot * N + offs_n, res.to(dtype), mask=n_ok)


@triton.jit(do_not_specialize=["num_experts"])
def _w13_route_all_kernel(x_ptr, logits_ptr, w13_ptr, act_ptr, weights_ptr, ids_ptr, num_experts, N, K,
                          stride_be, stride_bn, w2_ptr, w2_bytes, w2_piece, pf_ptr, pf_total, pf_piece,
                          TOP_K: tl.constexpr,
                          K_P: tl.constexpr, E_P: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """:func:`_w13_route_kernel` with every program covering ALL k slots for its ``BLOCK_N`` rows (a
    ``[k, BLOCK_N, BLOCK_K]`` tile, as the w2 launch): the routing is computed once per k slots' rows instead
    of once per slot, and each K-block is one large load. Chosen by a config's ``"ALL_SLOTS": true``."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    top_w, top_i = _route(logits_ptr, num_experts, TOP_K, K_P, E_P, RENORMALIZE)
    lanes = tl.arange(0, K_P)
    slot_ok = lanes < TOP_K
    if pid_n == 0:
        tl.store(weights_ptr + lanes, top_w, mask=slot_ok)
        tl.store(ids_ptr + lanes, top_i.to(tl.int64), mask=slot_ok)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = (w13_ptr + (top_i.to(tl.int64) * stride_be)[:, None, None]
              + (offs_n.to(tl.int64) * stride_bn)[None, :, None] + offs_k[None, None, :])
    rows_ok = slot_ok[:, None, None] & n_ok[None, :, None]
    acc_g = tl.zeros([K_P, BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([K_P, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        a = tl.load(x_ptr + k * BLOCK_K + offs_k, mask=k_ok, other=0.0).to(tl.float32)[None, None, :]
        g = tl.load(b_ptrs, mask=rows_ok & k_ok[None, None, :], other=0.0).to(tl.float32)
        u = tl.load(b_ptrs + N * stride_bn, mask=rows_ok & k_ok[None, None, :], other=0.0).to(tl.float32)
        acc_g += g * a
        acc_u += u * a
        b_ptrs += BLOCK_K
    dtype = act_ptr.dtype.element_ty
    gate = tl.sum(acc_g, axis=2).to(dtype).to(tl.float32)  # [K_P, BLOCK_N], rounded like the torch path
    s = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    res = s * tl.sum(acc_u, axis=2).to(dtype).to(tl.float32)
    tl.store(act_ptr + (lanes * N)[:, None] + offs_n[None, :], res.to(dtype), mask=slot_ok[:, None] & n_ok[None, :])


@triton.jit
def _w2_sum_kernel(act_ptr, w2_ptr, weights_ptr, ids_ptr, out_ptr, N, K, stride_be, stride_bn, pf_ptr, pf_total,
                   pf_piece, TOP_K: tl.constexpr, K_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PDL: tl.constexpr = False, PF_NEXT: tl.constexpr = 0):
    """``out[n] = sum_j weight[j] * (act[j] . w2[ids[j], n])`` over this program's ``BLOCK_N`` columns.

    Every k-block loads all k slots' rows at once (a ``[K_P, BLOCK_N, BLOCK_K]`` tile): one plain loop with
    large independent loads, which the compiler pipelines (a loop over slots with a per-slot epilogue did not:
    16 us instead of ~11 for Qwen3-30B-A3B's w2 on an H100, session 6 batch 1).

    ``PF_NEXT`` 1/2 (moe_prefetch.py): the grid asks L2 for ``pf_total`` bytes at ``pf_ptr`` (the next layer's
    qkv weight) after / before its PDL wait."""
    pid_n = tl.program_id(0)
    if PF_NEXT == 2:
        l2_prefetch(pf_ptr, pf_total, pf_piece, pid_n, 4)
    if PDL:  # as the w13 launch: the ids and activations come from it
        gdc_wait()
        gdc_launch_dependents()
    if PF_NEXT == 1:
        l2_prefetch(pf_ptr, pf_total, pf_piece, pid_n, 4)
    lanes = tl.arange(0, K_P)
    slot_ok = lanes < TOP_K
    experts = tl.load(ids_ptr + lanes, mask=slot_ok, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = (w2_ptr + (experts * stride_be)[:, None, None] + (offs_n.to(tl.int64) * stride_bn)[None, :, None]
              + offs_k[None, None, :])
    a_ptrs = act_ptr + (lanes * K)[:, None, None] + offs_k[None, None, :]
    rows_ok = slot_ok[:, None, None] & n_ok[None, :, None]
    acc = tl.zeros([K_P, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = (offs_k < K - kb * BLOCK_K)[None, None, :]
        a = tl.load(a_ptrs, mask=slot_ok[:, None, None] & k_ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=rows_ok & k_ok, other=0.0).to(tl.float32)
        acc += b * a
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    dtype = out_ptr.dtype.element_ty
    y = tl.sum(acc, axis=2).to(dtype).to(tl.float32)  # [K_P, BLOCK_N]: each slot's GEMV, rounded like torch
    w = tl.load(weights_ptr + lanes, mask=slot_ok, other=0.0).to(dtype).to(tl.float32)
    terms = tl.where(slot_ok[:, None], (y * w[:, None]).to(dtype).to(tl.float32), 0.0)
    tl.store(out_ptr + offs_n, tl.sum(terms, axis=0).to(dtype), mask=n_ok)


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def default_decode_config(num_slots: int, inter: int, hidden: int) -> dict:
    """Tiles of the two launches, from the H100 searches of session 6 (batch 1): w13 ``BLOCK_N`` 16 (8 when
    that leaves fewer than 256 programs) and ``BLOCK_K = min(512, H / 8)``, 8 warps once the accumulator tile
    reaches 8192 values (Qwen3-30B-A3B 16x256 at 4 warps, Mixtral 16x512 at 8: the best tried); w2 ``BLOCK_N``
    = H / 512 (>= 4: ~512 programs), its ``[k, BLOCK_N, BLOCK_K]`` tile at ~8192 values, 8 warps."""
    k_p = _p2(num_slots)
    bn13 = 16 if num_slots * triton.cdiv(inter, 16) >= 256 else 8
    bk13 = max(64, min(512, _p2(hidden) // 8))
    bn2 = min(32, max(4, _p2(hidden) // 512))
    bk2 = max(32, min(512, 8192 // (k_p * bn2)))
    return {"w13": {"BLOCK_N": bn13, "BLOCK_K": bk13, "num_warps": 8 if bn13 * bk13 >= 8192 else 4,
                    "num_stages": 3},
            "w2": {"BLOCK_N": bn2, "BLOCK_K": bk2, "num_warps": 8, "num_stages": 3}}


def decode_one(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
               renormalize: bool, config: dict | None = None, next_weight: torch.Tensor | None = None,
               routed: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token through routing and its k experts: ``x [1, H]``, ``router_logits [1, E]`` (any float dtype)
    -> (``out [1, H]``, routing weights ``[1, k]`` float32, expert ids ``[1, k]`` int64).

    ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` contiguous, ``x``'s dtype; ``config`` as
    :func:`default_decode_config` returns (``{"w13": {...}, "w2": {...}}``). L2 prefetch hints (moe_prefetch.py;
    same results): ``w13["PF_W2"]`` the routed experts' w2 during w13, ``w13["EVICT"]`` its loads' eviction
    policy, ``w13["PF_NEXT"]`` ``next_weight`` (the next layer's qkv weight) before w13's wait, ``w2["PF_NEXT"]``
    1/2 the same during w2 (after / before its wait). ``w2["PRE"]`` / ``w2["ONE"]`` (session 9's early w2 and one
    launch, 2-14% slower on the H200: removed in session 10) are refused; ``w2["EARLY"]`` = PRE (moe_w2_early.py,
    session 11) loads that many w2 K-blocks before its wait, with the ids from w13's program 0. ``routed``: (weights ``[1, k]`` float32,
    ids ``[1, k]`` int64) of these logits, already computed (the norm + router launch's route once): w13 reads the
    ids instead of routing in each program."""
    num_experts, two_i, hidden = w13.shape
    inter = two_i // 2
    cfg = config or default_decode_config(top_k, inter, hidden)
    c13, c2 = cfg["w13"], cfg["w2"]
    dev = x.device
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    if x.stride(-1) != 1:
        x = x.contiguous()
    pf_next = c2.get("PF_NEXT", 0)
    if pf_next not in (0, 1, 2):
        raise ValueError(f"decode_one: w2 PF_NEXT must be 0, 1 or 2, not {pf_next!r}")
    gone = [k for k in ("PRE", "ONE") if k in c2]
    if gone:
        raise ValueError(f"decode_one: w2 {gone} (the early w2 / one launch) were removed in session 10: they were "
                         f"slower (docs/moe.md)")
    early = check_early(c2)
    if early and (c13.get("ALL_SLOTS") or c13.get("DOT") or c13.get("ROUTE", "in") == "rank"):
        raise ValueError("decode_one: w2 EARLY needs the per-slot plain w13 kernel (not ALL_SLOTS / DOT / ROUTE rank)")
    route = c13.get("ROUTE", "in")
    if route not in ("in", "launch", "rank", "partial") or (route != "in" and c13.get("ALL_SLOTS")):
        raise ValueError(f"decode_one: w13 ROUTE must be 'in', 'rank', 'partial' or 'launch' (per-slot kernel), not "
                         f"{route!r}")
    if routed is not None:
        if route != "in" or c13.get("ALL_SLOTS"):
            raise ValueError("decode_one: routed ids need the per-slot w13 kernel with ROUTE 'in'")
        weights, ids = routed
    elif route == "launch":  # its own routing launch (cuda_moe_kernels.topk_softmax), w13 reads the ids
        from octavo.plugins.platforms.cuda_moe_kernels import topk_softmax

        weights, ids = topk_softmax(router_logits, top_k, renormalize)
    else:
        weights = torch.empty(1, top_k, dtype=torch.float32, device=dev)
        ids = torch.empty(1, top_k, dtype=torch.int64, device=dev)
    act = torch.empty(top_k, inter, dtype=x.dtype, device=dev)
    out = torch.empty(1, hidden, dtype=x.dtype, device=dev)
    all_slots = bool(c13.get("ALL_SLOTS", False))
    kernel13 = _w13_route_all_kernel if all_slots else _w13_route_kernel
    num_n13 = triton.cdiv(inter, c13["BLOCK_N"])
    grid13 = ((1 if all_slots else top_k) * num_n13,)
    extra13 = {}
    w2_bytes, w2_piece, pf13_total, pf13_piece = 0, 16, 0, 16
    if not all_slots:
        pf_w2, evict = bool(c13.get("PF_W2", False)), c13.get("EVICT", "")
        if evict not in ("", "evict_first", "evict_last"):
            raise ValueError(f"decode_one: w13 EVICT must be '', 'evict_first' or 'evict_last', not {evict!r}")
        if pf_w2:  # one expert's w2 bytes over the slot's num_n13 programs, 4 requests each
            w2_bytes, w2_piece = prefetch_split(w2[0] if w2.is_contiguous() else None, num_n13, 4)
            if w2_bytes != w2.stride(0) * w2.element_size():
                w2_bytes = 0  # interpreter, unaligned or ragged: no prefetch
        pf13_total, pf13_piece = prefetch_split(next_weight if c13.get("PF_NEXT") else None, grid13[0], 2)
        extra13 = {"PF_W2": w2_bytes > 0, "EVICT": evict, "ROUTE_IN": route != "launch" and routed is None,
                   "RANK": route == "rank", "PARTIAL": route == "partial",
                   "RANK_CH": min(16, _p2(num_experts)),
                   "PF_NEXT": pf13_total > 0,
                   "PIPE": bool(c13.get("PIPE", False)), "FLAG": bool(early),
                   "flag_ptr": w2_flags(x.device)}  # passed always: one specialisation (read only with FLAG)
    elif c13.get("PF_W2") or c13.get("EVICT") or c13.get("PF_NEXT") or c13.get("PIPE"):
        raise ValueError("decode_one: PF_W2 / EVICT / PF_NEXT / PIPE are for the per-slot w13 kernel, not ALL_SLOTS")
    if c13.get("DOT"):  # moe_w13_dot.py: the weights streamed through tl.dot's pipelined loads (not the same bits)
        if all_slots or any(c13.get(k) for k in ("PF_W2", "EVICT", "PF_NEXT", "PIPE")) or route not in ("in", "launch"):
            raise ValueError("decode_one: w13 DOT takes none of ALL_SLOTS / PF_W2 / EVICT / PF_NEXT / PIPE / ROUTE rank")
        from octavo.plugins.platforms.moe_w13_dot import w13_dot

        w13_dot(x, router_logits, w13, act, weights, ids, top_k, renormalize, extra13["ROUTE_IN"], c13, launch_opts())
    else:
        kernel13[grid13](x, router_logits, w13, act, weights, ids, num_experts, inter, hidden,
                         w13.stride(0), w13.stride(1), as_bytes(w2), w2_bytes, w2_piece,
                         as_bytes(next_weight) if pf13_total else as_bytes(w2), pf13_total, pf13_piece, TOP_K=top_k,
                         K_P=_p2(top_k), E_P=_p2(num_experts), RENORMALIZE=renormalize, BLOCK_N=c13["BLOCK_N"],
                         BLOCK_K=c13["BLOCK_K"], num_warps=c13.get("num_warps", 4),
                         num_stages=c13.get("num_stages", 3), **extra13, **launch_opts())
    if early:
        launch_w2_early(act, w2, weights, ids, out, top_k, c2, launch_opts())
        return out, weights, ids
    grid2 = triton.cdiv(hidden, c2["BLOCK_N"])
    pf_total, pf_piece = prefetch_split(next_weight if pf_next else None, grid2, 4)
    _w2_sum_kernel[(grid2,)](
        act, w2, weights, ids, out, hidden, inter, w2.stride(0), w2.stride(1),
        as_bytes(next_weight) if pf_total else as_bytes(w2), pf_total, pf_piece, TOP_K=top_k, K_P=_p2(top_k),
        BLOCK_N=c2["BLOCK_N"], BLOCK_K=c2["BLOCK_K"], num_warps=c2.get("num_warps", 4),
        num_stages=c2.get("num_stages", 3), PF_NEXT=pf_next if pf_total else 0, **launch_opts())
    return out, weights, ids
