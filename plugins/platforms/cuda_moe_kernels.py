"""Triton kernels of the fused MoE layer: token alignment by expert and the two grouped GEMMs.

The layout follows the usual design of fused MoE kernels (vLLM, SGLang), written here from scratch:

1. **Align** (:func:`moe_align`): the ``n * k`` token-slots (slot ``s`` = token ``s // k``, its ``s % k``-th
   expert) are grouped by expert and each expert's group is padded to a multiple of ``BLOCK_M``, so every
   ``BLOCK_M`` rows of ``sorted_slots`` belong to one expert (``block_expert``). Padding rows hold the
   sentinel ``n * k``. One launch, one program per expert, no host sync: the buffers are sized by the
   upper bound ``n*k + min(E, n*k) * (BLOCK_M - 1)`` and the GEMMs read the real total from the device, so
   the whole layer can be captured in a CUDA graph (the torch path cannot: it reads counts on the host).
2. **w13 GEMM** (``GATED``): ``act[slot, j] = silu(x[tok] . w1[e, j]) * (x[tok] . w3[e, j])`` for each
   slot of a block; gate and up are two accumulators of the same tile, so the ``[n*k, 2I]`` intermediate of
   the torch path never exists.
3. **w2 GEMM** (``MUL_WEIGHT``): ``y[slot] = weight[slot] * (act[slot] . w2[e])``.
4. The sum over the k slots of each token is ``y.view(n, k, H).sum(1)`` (fp32 accumulation in torch).

Accumulation is fp32 (``tl.dot``); values are rounded to the model dtype where the torch path rounds
(after each GEMM, after the SiLU), so the kernel agrees with ``FusedMoE.apply_experts`` to about one ulp.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["numel", "num_experts"])
def _moe_align_kernel(ids_ptr, counts_ptr, sorted_ptr, block_expert_ptr, total_ptr, numel, num_experts,
                      BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_P: tl.constexpr, COUNTS_GIVEN: tl.constexpr):
    """Program ``e``: every expert's count (to find its padded start), then its own slots in token order.

    Counting in every program costs E x numel compares per program: fine for decode-sized batches; for large
    ones (``COUNTS_GIVEN``) the counts come from one scatter-add before the launch.
    """
    e = tl.program_id(0)
    experts = tl.arange(0, E_P)
    offs = tl.arange(0, CHUNK)
    if COUNTS_GIVEN:
        counts = tl.load(counts_ptr + experts, mask=experts < num_experts, other=0)
    else:
        counts = tl.zeros([E_P], dtype=tl.int32)
        for start in range(0, numel, CHUNK):
            ids = tl.load(ids_ptr + start + offs, mask=start + offs < numel, other=-1).to(tl.int32)
            counts += tl.sum((ids[None, :] == experts[:, None]).to(tl.int32), axis=1)
    # ids >= num_experts (expert parallelism's "held elsewhere", lanes past E in E_P) get no rows
    padded = tl.where(experts < num_experts, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    my_start = tl.sum(tl.where(experts < e, padded, 0), axis=0)
    my_count = tl.sum(tl.where(experts == e, counts, 0), axis=0)
    my_padded = tl.sum(tl.where(experts == e, padded, 0), axis=0)
    if e == 0:
        tl.store(total_ptr, tl.sum(padded, axis=0))
    running = my_start
    for start in range(0, numel, CHUNK):
        ids = tl.load(ids_ptr + start + offs, mask=start + offs < numel, other=-1).to(tl.int32)
        hit = (ids == e).to(tl.int32)
        rank = tl.cumsum(hit, axis=0) - hit  # exclusive: earlier slots of this expert in the chunk
        tl.store(sorted_ptr + running + rank, start + offs, mask=hit != 0)
        running += tl.sum(hit, axis=0)
    pad = tl.arange(0, BLOCK_M)  # fewer than BLOCK_M padding rows after the expert's slots
    tl.store(sorted_ptr + my_start + my_count + pad, numel, mask=pad < my_padded - my_count)
    first_block = my_start // BLOCK_M
    for b in range(0, my_padded // BLOCK_M, CHUNK):
        tl.store(block_expert_ptr + first_block + b + offs, e, mask=b + offs < my_padded // BLOCK_M)


@triton.jit(do_not_specialize=["num_slots", "em"])
def _moe_gemm_kernel(a_ptr, b_ptr, c_ptr, weight_ptr, sorted_ptr, block_expert_ptr, total_ptr,
                     N, K, num_slots, em, stride_am, stride_be, stride_bn, stride_cm,
                     A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr, UPCAST: tl.constexpr,
                     DIRECT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """``C[slot, n] = A[slot // A_ROW_DIV] . B[expert, n]`` over the aligned blocks (see module docstring).

    ``B`` is ``[E, N(*2 if GATED), K]`` row-major in K (a linear layer's weight per expert); with ``GATED``
    rows ``n`` and ``N + n`` are gate and up, and C gets ``silu(gate) * up``. ``DIRECT`` (one token: its k
    experts are distinct): block ``m`` is slot ``m`` alone, its expert read from ``block_expert_ptr`` (the
    routing ids themselves), so no align launch is needed; ``em`` is then the number of slots.
    """
    pid = tl.program_id(0)
    num_pid_m = em if DIRECT else tl.cdiv(em, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n  # grouped order: neighbouring programs share B tiles in L2
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    if DIRECT:
        rows = tl.arange(0, BLOCK_M)
        slots = tl.where(rows == 0, pid_m, num_slots)  # one real row, the rest padding
    else:
        if pid_m * BLOCK_M >= tl.load(total_ptr):
            return  # past the padded total: the buffers were sized for the worst case
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slots = tl.load(sorted_ptr + offs_m)
    row_ok = slots < num_slots
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    a_rows = (slots // A_ROW_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:  # Triton's CPU interpreter multiplies bf16 bit patterns as integers in tl.dot
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        if GATED:
            b_up = tl.load(b_ptrs + N * stride_bn, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if UPCAST:
                b_up = b_up.to(tl.float32)
            acc_up = tl.dot(a, b_up, acc_up)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    dtype = c_ptr.dtype.element_ty
    if GATED:  # round like the torch path: gate/up to the dtype, silu to the dtype, then the product
        g = acc.to(dtype).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        res = s * acc_up.to(dtype).to(tl.float32)
    else:
        res = acc
    if MUL_WEIGHT:
        w = tl.load(weight_ptr + slots, mask=row_ok, other=0.0).to(dtype).to(tl.float32)
        res = res.to(dtype).to(tl.float32) * w[:, None]
    c_ptrs = c_ptr + slots.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, res.to(dtype), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _topk_softmax_kernel(logits_ptr, weights_ptr, ids_ptr, num_experts, stride_row,
                         TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr, RENORMALIZE: tl.constexpr):
    """One token per program: float32 softmax over its router logits, top-k by k rounds of argmax (the
    lowest index wins a tie), optionally renormalised: the five torch launches of routing in one."""
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, E_P)
    ok = experts < num_experts
    x = tl.load(logits_ptr + row * stride_row + experts, mask=ok, other=-float("inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = tl.where(ok, p / tl.sum(p, axis=0), -1.0)
    lanes = tl.arange(0, K_P)
    top_w = tl.zeros([K_P], dtype=tl.float32)
    top_i = tl.zeros([K_P], dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        idx = tl.min(tl.where(p == best, experts, E_P), axis=0)
        top_w = tl.where(lanes == j, best, top_w)
        top_i = tl.where(lanes == j, idx.to(tl.int64), top_i)
        p = tl.where(experts == idx, -1.0, p)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)  # lanes past TOP_K hold 0
    tl.store(weights_ptr + row * TOP_K + lanes, top_w, mask=lanes < TOP_K)
    tl.store(ids_ptr + row * TOP_K + lanes, top_i, mask=lanes < TOP_K)


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``FusedMoE.select_experts`` in one launch: ``[n, E]`` logits (any float dtype) -> (``[n, k]`` float32
    weights in descending order, ``[n, k]`` int64 expert ids)."""
    n, num_experts = router_logits.shape
    weights = torch.empty(n, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(n, top_k, dtype=torch.int64, device=router_logits.device)
    if n == 0:
        return weights, ids
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    _topk_softmax_kernel[(n,)](router_logits, weights, ids, num_experts, router_logits.stride(0), TOP_K=top_k,
                               K_P=_p2(top_k), E_P=_p2(num_experts), RENORMALIZE=renormalize, num_warps=1)
    return weights, ids


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def padded_bound(num_slots: int, num_experts: int, block_m: int) -> int:
    """Most rows the aligned layout can need: each non-empty expert pads by fewer than ``block_m``."""
    em = num_slots + min(num_experts, num_slots) * (block_m - 1)
    return triton.cdiv(em, block_m) * block_m


COUNT_IN_KERNEL_MAX = 1024  # slots up to which each align program counts every expert itself (one launch)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, chunk: int | None = None,
              count_in_kernel: bool | None = None):
    """Group the token-slots of ``topk_ids [n, k]`` by expert, padded to ``block_m``.

    Returns ``(sorted_slots [EM] int32, block_expert [EM / block_m] int32, total [1] int32)``; ids outside
    ``0 .. num_experts - 1`` (expert parallelism's "held elsewhere") are left out. Rows past ``total`` are
    undefined and never read. ``chunk`` (slots per step of each program's loops) and ``count_in_kernel``
    (default: up to ``COUNT_IN_KERNEL_MAX`` slots) are for tests.
    """
    ids = topk_ids.reshape(-1)
    numel = ids.numel()
    em = padded_bound(numel, num_experts, block_m)
    dev = topk_ids.device
    sorted_slots = torch.empty(em, dtype=torch.int32, device=dev)
    block_expert = torch.empty(em // block_m, dtype=torch.int32, device=dev)
    total = torch.empty(1, dtype=torch.int32, device=dev)
    e_p = _p2(num_experts)
    if count_in_kernel is None:
        count_in_kernel = numel <= COUNT_IN_KERNEL_MAX
    if count_in_kernel:  # the count pass holds an [E_P, CHUNK] mask; few chunk sizes keep few compiled variants
        counts = total
        chunk = chunk or (64 if numel <= 64 else max(64, 8192 // e_p))
    else:  # ids past the experts land in bucket num_experts, which the kernel ignores
        counts = torch.zeros(num_experts + 1, dtype=torch.int32, device=dev)
        counts.scatter_add_(0, ids.clamp(max=num_experts), torch.ones_like(ids, dtype=torch.int32))
        chunk = chunk or 1024
    _moe_align_kernel[(num_experts,)](ids, counts, sorted_slots, block_expert, total, numel, num_experts,
                                      BLOCK_M=block_m, CHUNK=chunk, E_P=e_p, COUNTS_GIVEN=not count_in_kernel)
    return sorted_slots, block_expert, total


def direct_layout(topk_ids: torch.Tensor):
    """The layout of one token (``topk_ids [1, k]``, distinct experts): each slot is its own block, so the
    GEMMs read the expert of block ``m`` straight from the ids and no align launch runs. Same tuple shape
    as :func:`moe_align`'s result, with ``None`` for the parts that do not exist."""
    return topk_ids.reshape(-1), None, None


def moe_layout(topk_ids: torch.Tensor, num_experts: int, block_m: int, direct: bool):
    """:func:`direct_layout` when ``direct`` (batch 1), else :func:`moe_align`."""
    return direct_layout(topk_ids) if direct else moe_align(topk_ids, num_experts, block_m)


def _gemm(a, b, c, weights, aligned, num_slots, n, k, a_row_div, gated, mul_weight, cfg):
    sorted_slots, block_expert, total = aligned
    direct = block_expert is None
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if direct:  # the ids serve as block experts; the unused pointers get any tensor
        em = num_slots
        block_expert = total = sorted_slots
        grid = (em * triton.cdiv(n, bn),)
    else:
        em = sorted_slots.numel()
        grid = (triton.cdiv(em, bm) * triton.cdiv(n, bn),)
    upcast = a.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    _moe_gemm_kernel[grid](a, b, c, weights, sorted_slots, block_expert, total, n, k, num_slots, em,
                           a.stride(0), b.stride(0), b.stride(1), c.stride(0),
                           A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=mul_weight, UPCAST=upcast, DIRECT=direct,
                           BLOCK_M=bm, BLOCK_N=bn,
                           BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg.get("GROUP_M", 1),
                           num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, config: dict, w2_config: dict | None = None,
                  zero_missing: bool = False) -> torch.Tensor:
    """``x [n, H]`` through each token's k SiLU-gated experts, weighted and summed -> ``[n, H]``.

    Args:
        w13: ``[E, 2I, H]`` (gate rows then up rows); w2: ``[E, H, I]``; both contiguous, ``x``'s dtype.
        topk_weights, topk_ids: ``[n, k]`` routing (float32 weights, integer expert ids).
        config: tile sizes for the w13 GEMM (``BLOCK_M/N/K``, ``GROUP_M``, ``num_warps``, ``num_stages``);
            ``w2_config`` overrides any of them for the w2 GEMM except ``BLOCK_M`` (the shared layout's).
        zero_missing: some ids may lie outside ``0 .. E-1`` (expert parallelism): zero those slots' rows.
    """
    n, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    num_slots = n * top_k
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    cfg2 = {**config, **(w2_config or {}), "BLOCK_M": config["BLOCK_M"]}
    # one token routes to k distinct experts: no align needed (not under expert parallelism, whose
    # "held elsewhere" id may repeat and must give zero rows)
    aligned = moe_layout(topk_ids, num_experts, config["BLOCK_M"], direct=n == 1 and not zero_missing)
    act = torch.empty(num_slots, inter, dtype=x.dtype, device=x.device)
    slots_out = (torch.zeros if zero_missing else torch.empty)(num_slots, hidden, dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).contiguous()
    _gemm(x, w13, act, weights, aligned, num_slots, inter, hidden, top_k, True, False, config)
    _gemm(act, w2, slots_out, weights, aligned, num_slots, hidden, inter, 1, False, True, cfg2)
    return torch.sum(slots_out.view(n, top_k, hidden), dim=1, out=out)
