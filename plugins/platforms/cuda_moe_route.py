"""The batch-1 MoE routing of one token inside a Triton kernel (float32 softmax over the router logits, top-k by
k rounds of argmax, the lowest expert winning a tie, optional renormalisation: ``topk_softmax``'s arithmetic).

Its own module: the w13 launch (``moe_decode_kernels``) runs it, or (opt-in ``OCTAVO_MOE_ROUTE_ONCE=1``, session 11)
the last program of the norm + router launch runs it once and w13 reads the ids (``moe_norm_router``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _route(logits_ptr, num_experts, TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr,
           RENORMALIZE: tl.constexpr):
    """(weights [K_P] fp32, ids [K_P] int32) of one token; lanes past TOP_K hold 0 (``topk_softmax``'s math).

    Each top-k round is ONE max-reduction over int64 keys ``bits(p) << 32 | (E_P - 1 - expert)``: the float
    bits of a probability (>= 0) order like the probability, and the low word makes the lowest expert win a
    tie. Same choice as ``topk_softmax``'s max-then-min rounds, half the cross-warp reductions: every program of
    the w13 launch runs this before its first weight load. No default constexpr arguments: Triton 3.6 does not wrap
    a jit helper's default (a default "" reached ``tl.load`` as a plain str; session 9 batch 1)."""
    experts = tl.arange(0, E_P)
    x = tl.load(logits_ptr + experts, mask=experts < num_experts, other=-float("inf")).to(tl.float32)
    return _route_values(x, num_experts, TOP_K, K_P, E_P, RENORMALIZE)


@triton.jit
def _route_values(x, num_experts, TOP_K: tl.constexpr, K_P: tl.constexpr, E_P: tl.constexpr,
                  RENORMALIZE: tl.constexpr):
    """:func:`_route` on logits already loaded: ``x [E_P]`` float32, ``-inf`` past ``num_experts`` (the norm +
    router launch's last program loads them with ``.cg``: other programs wrote them in the same launch)."""
    experts = tl.arange(0, E_P)
    ok = experts < num_experts
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(tl.where(ok, p, 0.0), axis=0)
    bits = p.to(tl.int32, bitcast=True).to(tl.int64)
    key = tl.where(ok, (bits << 32) | (E_P - 1 - experts).to(tl.int64), -1)
    lanes = tl.arange(0, K_P)
    top_w = tl.zeros([K_P], dtype=tl.float32)
    top_i = tl.zeros([K_P], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(key, axis=0)
        idx = E_P - 1 - (best & (E_P - 1)).to(tl.int32)  # the low word is < E_P (a power of two)
        top_w = tl.where(lanes == j, (best >> 32).to(tl.int32).to(tl.float32, bitcast=True), top_w)
        top_i = tl.where(lanes == j, idx, top_i)
        key = tl.where(key == best, -1, key)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)
    return top_w, top_i


@triton.jit
def _route_slot(logits_ptr, num_experts, slot, E_P: tl.constexpr):
    """The expert of rank ``slot`` alone (int64): :func:`_route`'s rounds 0..slot (the same keys, the same choice),
    so a w13 program of slot s runs s + 1 block-wide max rounds instead of k (w13 ``ROUTE`` "partial", session 11)."""
    experts = tl.arange(0, E_P)
    ok = experts < num_experts
    x = tl.load(logits_ptr + experts, mask=ok, other=-float("inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(tl.where(ok, p, 0.0), axis=0)
    key = tl.where(ok, (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E_P - 1 - experts).to(tl.int64), -1)
    best = tl.max(key, axis=0)
    for _ in range(0, slot):
        key = tl.where(key == best, -1, key)
        best = tl.max(key, axis=0)
    return (E_P - 1 - (best & (E_P - 1))).to(tl.int64)


@triton.jit
def _route_store(logits_ptr, weights_ptr, ids_ptr, num_experts, pid, slot, TOP_K: tl.constexpr, K_P: tl.constexpr,
                 E_P: tl.constexpr, RENORMALIZE: tl.constexpr):
    """A w13 program's in-kernel routing (``moe_decode_kernels``, ``moe_w13_dot``): every program routes the token
    (:func:`_route`), program 0 stores the weights and ids for the w2 launch; returns the expert of ``slot`` (int64)."""
    top_w, top_i = _route(logits_ptr, num_experts, TOP_K, K_P, E_P, RENORMALIZE)
    lanes = tl.arange(0, K_P)
    if pid == 0:
        tl.store(weights_ptr + lanes, top_w, mask=lanes < TOP_K)
        tl.store(ids_ptr + lanes, top_i.to(tl.int64), mask=lanes < TOP_K)
    return tl.sum(tl.where(lanes == slot, top_i, 0), axis=0).to(tl.int64)
