"""Batch-1 MoE w13 (gate and up GEMVs of the token's k experts) as ``tl.dot`` tiles, so that Triton's software
pipeliner may stream the weights (opt-in: the w13 config's ``"DOT": true``, session 11; GPU A/B: moe9.sh ab12).

Why: the plain-load GEMV of ``moe_decode_kernels._w13_route_kernel`` keeps ``[BLOCK_N, BLOCK_K]`` fp32
accumulators (154 registers a program at 16 x 256: 3 programs per SM) and streams Qwen3-30B-A3B's 50 MB at ~73 % of
the H100's copy rate (22.9 us a layer, session 11). Triton's software pipeliner is built around loads that feed a
dot. Here the token row is the ``[BLOCK_K, 16]`` operand of a dot (the same column 16 times: tensor-core work is
free at batch 1) and each program's ``[BLOCK_N, BLOCK_K]`` gate and up tiles are the other, with ``[BLOCK_N, 16]``
fp32 accumulators: 64 registers at 16 x 256 (sm_90 build), so 8 programs per SM fit by registers.

Not the same bits as the plain-load kernel: the tensor cores add the K products in another order (the gate and up
sums agree to fp32 rounding; after the bf16 rounding of gate / up an output may differ in its last bit). The
rounding steps after the sums are the same (gate and up to the dtype, SiLU, product). Routing: the ids from the
norm + router launch (route once) or the same in-kernel routing (``cuda_moe_route._route``), program 0 writing
the weights and ids for the w2 launch. Needs ``N % BLOCK_N == 0`` and ``K % BLOCK_K == 0`` (no masks in the loop).
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_moe_route import _route_store
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait


@triton.jit(do_not_specialize=["num_experts"])
def _w13_dot_kernel(x_ptr, logits_ptr, w13_ptr, act_ptr, weights_ptr, ids_ptr, num_experts, N, K, stride_be,
                    stride_bn, TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr,
                    RENORMALIZE: tl.constexpr, ROUTE_IN: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """``act[slot, n] = silu(x . w1[e, n]) * (x . w3[e, n])`` for slot ``pid // (N / BLOCK_N)`` (see the module)."""
    pid = tl.program_id(0)
    if PDL:  # cuda_pdl.py: the expert depends on the producer's logits / ids
        gdc_wait()
        gdc_launch_dependents()
    num_n = N // BLOCK_N
    slot = pid // num_n
    pid_n = pid % num_n
    if ROUTE_IN:
        expert = _route_store(logits_ptr, weights_ptr, ids_ptr, num_experts, pid, slot, TOP_K, K_P, E_P, RENORMALIZE)
    else:
        expert = tl.load(ids_ptr + slot)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, 16)
    g_ptrs = w13_ptr + expert * stride_be + offs_n.to(tl.int64)[:, None] * stride_bn + offs_k[None, :]
    x_ptrs = x_ptr + offs_k[:, None] + cols[None, :] * 0  # [BLOCK_K, 16]: the row in every column
    acc_g = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    for _ in range(0, K // BLOCK_K):
        a = tl.load(x_ptrs)
        g = tl.load(g_ptrs)
        u = tl.load(g_ptrs + N * stride_bn)
        acc_g = tl.dot(g, a, acc_g)
        acc_u = tl.dot(u, a, acc_u)
        g_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    dtype = act_ptr.dtype.element_ty
    first = cols[None, :] == 0
    gate = tl.sum(tl.where(first, acc_g, 0.0), axis=1).to(dtype).to(tl.float32)  # column 0; rounded as the torch path
    s = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    res = s * tl.sum(tl.where(first, acc_u, 0.0), axis=1).to(dtype).to(tl.float32)
    tl.store(act_ptr + slot * N + offs_n, res.to(dtype))


def w13_dot(x, router_logits, w13, act, weights, ids, top_k: int, renormalize: bool, route_in: bool, cfg: dict,
            launch: dict) -> None:
    """Launch :func:`_w13_dot_kernel` into ``act [k, I]`` (``cfg``: BLOCK_N, BLOCK_K, num_warps, num_stages)."""
    num_experts, two_i, hidden = w13.shape
    inter = two_i // 2
    bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
    if inter % bn or hidden % bk or bn < 16 or bk < 16:
        raise ValueError(f"decode_one: w13 DOT needs BLOCK_N ({bn}) dividing I={inter} and BLOCK_K ({bk}) dividing "
                         f"H={hidden}, both >= 16")
    k_p = 1 << max(0, top_k - 1).bit_length()
    e_p = 1 << max(0, num_experts - 1).bit_length()
    _w13_dot_kernel[(top_k * (inter // bn),)](
        x, router_logits, w13, act, weights, ids, num_experts, inter, hidden, w13.stride(0), w13.stride(1),
        TOP_K=top_k, K_P=k_p, E_P=e_p, RENORMALIZE=renormalize, ROUTE_IN=route_in, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 4), **launch)
