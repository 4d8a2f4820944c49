"""``FusedMoE``: loading per-expert tensors into the stacked weights, routing, and the grouped and static
(graph-safe) expert paths against a float64 per-token loop."""

import pytest
import torch
import torch.nn.functional as F

from octavo.nn.fused_moe import FusedMoE

E, K, H, INTER = 6, 2, 16, 24


def _layer(renormalize=True) -> tuple[FusedMoE, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    layer = FusedMoE(E, K, H, INTER, renormalize=renormalize, prefix="mlp.experts")
    experts = []
    for e in range(E):
        w1, w3, w2 = (torch.randn(INTER, H, generator=gen) * 0.2, torch.randn(INTER, H, generator=gen) * 0.2,
                      torch.randn(H, INTER, generator=gen) * 0.2)
        layer.weight_loader(layer.w13_weight, w1, shard_id="w1", expert_id=e)
        layer.weight_loader(layer.w13_weight, w3, shard_id="w3", expert_id=e)
        layer.weight_loader(layer.w2_weight, w2, shard_id="w2", expert_id=e)
        experts.append((w1, w3, w2))
    return layer, experts


def _reference(x, logits, experts, renormalize):
    probs = torch.softmax(logits.double(), -1)
    w, ids = torch.topk(probs, K, -1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(K):
            w1, w3, w2 = (p.double() for p in experts[ids[t, j]])
            out[t] += w[t, j] * ((F.silu(x[t].double() @ w1.T) * (x[t].double() @ w3.T)) @ w2.T)
    return out


@pytest.mark.parametrize("renormalize", [True, False])
def test_grouped_and_static_paths_match_reference(renormalize):
    layer, experts = _layer(renormalize)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(11, H, generator=gen)
    logits = torch.randn(11, E, generator=gen)
    logits[:, 5] = -1e4  # expert 5 gets no token: the grouped path must skip it
    want = _reference(x, logits, experts, renormalize)
    assert torch.allclose(layer(x, logits).double(), want, atol=1e-5)
    w, ids = layer.select_experts(logits)
    assert torch.allclose(layer.apply_experts_static(x, w, ids).double(), want, atol=1e-5)
    assert torch.allclose(w.sum(-1), torch.ones(11)) == renormalize


def test_loader_places_each_expert_and_refuses_mismatches():
    layer, experts = _layer()
    w1, w3, w2 = experts[3]
    assert torch.equal(layer.w13_weight[3, :INTER], w1) and torch.equal(layer.w13_weight[3, INTER:], w3)
    assert torch.equal(layer.w2_weight[3], w2)
    with pytest.raises(ValueError, match="expert 9 does not exist"):
        layer.weight_loader(layer.w2_weight, w2, shard_id="w2", expert_id=9)
    with pytest.raises(ValueError, match="does not fit"):
        layer.weight_loader(layer.w2_weight, w2.T, shard_id="w2", expert_id=0)
    with pytest.raises(ValueError, match="top_k"):
        FusedMoE(4, 5, H, INTER)
