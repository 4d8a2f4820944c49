"""Expert parallelism (``enable_expert_parallel``).

Fast part (``make test``): the layer math without processes. Two ``FusedMoE`` layers built as tensor-parallel
ranks 0 and 1 of 2 with expert parallelism (each holds 2 of the 4 experts, whole) load the same per-expert
checkpoint tensors; the sum of their outputs (what the all-reduce computes) equals the single-rank layer, for
the grouped path and the graph-safe static path. Also: a dense model refuses the setting, and experts that do
not divide over the ranks are refused naming the count. End to end through the ``mp`` executor (Qwen3-MoE, TP=2
and TP=2 x PP=2 with expert parallelism, vs the single process): tests/distributed/test_parallel_matrix.py.
"""

from __future__ import annotations

import pytest
import torch

import octavo.nn.fused_moe as fused_moe
from octavo.nn.fused_moe import FusedMoE
from octavo.nn.parallel import set_expert_parallel

E, K, H, INTER, N = 4, 2, 16, 24, 7


def build(monkeypatch, rank: int, size: int, ep: bool, weights) -> FusedMoE:
    monkeypatch.setattr(fused_moe, "get_tp_rank", lambda: rank)
    monkeypatch.setattr(fused_moe, "get_tp_size", lambda: size)
    set_expert_parallel(ep)
    try:
        layer = FusedMoE(E, K, H, INTER, renormalize=False, reduce_results=False, prefix="moe")
    finally:
        set_expert_parallel(False)
    for (e, shard), w in weights.items():
        param = layer.w2_weight if shard == "w2" else layer.w13_weight
        layer.weight_loader(param, w, shard_id=shard, expert_id=e)
    return layer


@pytest.mark.parametrize("static", [False, True], ids=["grouped", "static"])
def test_expert_parallel_ranks_sum_to_the_single_rank_layer(monkeypatch, static):
    torch.manual_seed(0)
    weights = {(e, s): torch.randn(H if s == "w2" else INTER, INTER if s == "w2" else H, dtype=torch.float64)
               for e in range(E) for s in ("w1", "w3", "w2")}
    x, logits = torch.randn(N, H, dtype=torch.float64), torch.randn(N, E, dtype=torch.float64)
    torch.set_default_dtype(torch.float64)
    try:
        whole = build(monkeypatch, 0, 1, False, weights)
        ranks = [build(monkeypatch, r, 2, True, weights) for r in range(2)]
    finally:
        torch.set_default_dtype(torch.float32)
    assert [(r.expert_start, r.num_local_experts, r.w13_weight.shape[0]) for r in ranks] == [(0, 2, 2), (2, 2, 2)]
    if static:
        for layer in (whole, *ranks):
            layer.apply_experts = layer.apply_experts_static
    want = whole(x, logits)
    got = sum(r(x, logits) for r in ranks)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert all(r(x, logits).abs().sum() > 0 for r in ranks)  # both ranks really hold routed experts


def test_experts_must_divide_over_the_ranks(monkeypatch):
    with pytest.raises(ValueError, match="num_experts=4 is not divisible by tensor_parallel_size=3"):
        build(monkeypatch, 0, 3, True, {})


def test_dense_model_refuses_expert_parallel(tmp_path):
    import transformers as T

    from octavo.config import OctavoSettings
    from octavo.core.worker import create_worker
    from tests.distributed.test_pipeline_parallel import save_checkpoint
    from tests.plugins.test_model_contracts import TINY

    path = save_checkpoint(T.LlamaConfig(architectures=["LlamaForCausalLM"], **TINY), tmp_path)
    settings = OctavoSettings.from_kwargs(model=path, dtype="float32", kv_cache_memory_bytes=8 << 20,
                                          max_model_len=128, enable_expert_parallel=True)
    with pytest.raises(ValueError, match="enable_expert_parallel: LlamaForCausalLM has no experts"):
        create_worker(settings)  # in this process: the check runs right after the model is built
