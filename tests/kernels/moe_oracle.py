"""Shapes, random routing / weights and the float64 per-token oracle of one MoE layer, shared by the interpreter
cases of the general fused kernel (moe_interp_cases.py) and of the batch-1 path (moe_decode_interp_cases.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

E, K, H, INTER = 8, 2, 64, 128
SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2}


def _routing(n, num_experts=E, top_k=K, seed=0):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, num_experts, generator=gen), -1)
    w, ids = torch.topk(probs, top_k, -1)
    return w / w.sum(-1, keepdim=True), ids


def _weights(dtype, num_experts=E, hidden=H, inter=INTER, seed=1):
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) * hidden ** -0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, generator=gen) * inter ** -0.5).to(dtype)
    return w13, w2


def _reference(x, w13, w2, weights, ids):
    """float64 per-token loop; ids outside the experts (expert parallelism) contribute nothing."""
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e >= w13.shape[0]:
                continue
            h = x[t].double() @ w13[e].double().T
            out[t] += float(weights[t, j]) * ((F.silu(h[:inter]) * h[inter:]) @ w2[e].double().T)
    return out


def _layer(dtype, renormalize=True):
    """A FusedMoE layer of the default shape holding :func:`_weights`."""
    from octavo.nn.fused_moe import FusedMoE

    layer = FusedMoE(E, K, H, INTER, renormalize=renormalize, prefix="mlp.experts")
    w13, w2 = _weights(dtype)
    layer.w13_weight.data, layer.w2_weight.data = w13, w2
    return layer
