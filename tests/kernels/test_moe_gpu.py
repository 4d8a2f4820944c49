"""The Triton fused MoE kernel on a CUDA GPU (skips without one).

1. One layer at a mid-size shape, bf16 and fp16: the kernel against the layer's grouped torch path, eager and
   replayed from a CUDA graph (the kernel has no host sync, so whole decode steps can be captured with it).
2. End to end through ``LLM``: tiny random-weight Mixtral-like (8 experts, top-2) and Qwen3-MoE-like
   (16 experts, top-4, renormalised) checkpoints, bf16, CUDA graphs on, kernel installed by the cuda
   platform, against the same engine with its layers put back on the torch path (eager): greedy tokens
   identical until the first step where the torch path's own top-2 logprob margin is below ``MARGIN``.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MARGIN = 0.1  # bf16 logits this close may swap order between two correct summation orders


def _layer(e, k, h, inter, dtype, seed=0):
    from octavo.nn.fused_moe import FusedMoE

    torch.manual_seed(seed)
    layer = FusedMoE(e, k, h, inter, renormalize=True, prefix="test.experts").cuda()
    layer.w13_weight.data = (torch.randn(e, 2 * inter, h, device="cuda") * h ** -0.5).to(dtype)
    layer.w2_weight.data = (torch.randn(e, h, inter, device="cuda") * inter ** -0.5).to(dtype)
    return layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_layer_matches_torch_path_eager_and_in_cuda_graph(dtype):
    from octavo.plugins.platforms import cuda_moe

    layer = _layer(32, 4, 1024, 768, dtype)
    assert cuda_moe.install_moe_kernels(layer, dtype, torch.device("cuda"))["triton"] == 1
    tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
    for n in (1, 7, 64):  # large batches (BLOCK_M 32/64, counts by scatter-add) are checked by moe_bench.py
        x = torch.randn(n, 1024, device="cuda").to(dtype)
        logits = torch.randn(n, 32, device="cuda")
        w, ids = layer.select_experts(logits)
        want = type(layer).apply_experts(layer, x, w, ids).float()
        got = layer.apply_experts(x, w, ids).float()
        assert (got - want).abs().max() <= tol * want.abs().max(), n
    # graph: capture with one routing, replay with another
    n = 8
    x = torch.randn(n, 1024, device="cuda").to(dtype)
    logits = torch.randn(n, 32, device="cuda")
    layer(x, logits)  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x, logits)
    x.copy_(torch.randn(n, 1024, device="cuda").to(dtype))
    logits.copy_(torch.randn(n, 32, device="cuda"))
    graph.replay()
    w, ids = layer.select_experts(logits)
    want = type(layer).apply_experts(layer, x, w, ids).float()
    assert (out.float() - want).abs().max() <= tol * want.abs().max()


def _checkpoint(root, arch):
    import transformers as T

    common = dict(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.08,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if arch == "MixtralForCausalLM":
        cfg = T.MixtralConfig(architectures=[arch], num_local_experts=8, num_experts_per_tok=2, intermediate_size=512,
                              **common)
    else:
        cfg = T.Qwen3MoeConfig(architectures=[arch], num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
                               norm_topk_prob=True, intermediate_size=512, head_dim=64, **common)
    torch.manual_seed(0)
    path = str(root / arch)
    getattr(T, arch)(cfg).save_pretrained(path)
    return path


def _kernel_then_torch_path(path, prompts):
    """Greedy outputs with the kernel (CUDA graphs on), then, in the same engine, with every ``FusedMoE`` back
    on the torch path and the graph runner off (one engine per model keeps the GPU run short)."""
    from octavo import LLM, SamplingParams
    from octavo.nn.fused_moe import FusedMoE
    from octavo.plugins.platforms.cuda_moe import use_torch_path

    llm = LLM(model=path, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=4,
              kv_cache_memory_bytes=64 << 20, enable_prefix_caching=False, seed=0)
    runner = llm.llm_engine.core.executor.driver.runner
    moe = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    params = SamplingParams(max_tokens=16, temperature=0, logprobs=2, ignore_eos=True)
    installed = sum("apply_experts" in m.__dict__ for m in moe)
    graphs = runner.graph_runner is not None
    kernel = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for m in moe:
        use_torch_path(m)
    runner.graph_runner = None
    ref = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    del llm, runner, moe
    gc.collect()
    torch.cuda.empty_cache()
    return kernel, ref, installed, graphs


@pytest.mark.parametrize("arch", ["MixtralForCausalLM", "Qwen3MoeForCausalLM"])
def test_tiny_moe_model_greedy_parity_with_torch_path(arch, tmp_path, monkeypatch):
    path = _checkpoint(tmp_path, arch)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 9, 40)]
    monkeypatch.delenv("OCTAVO_MOE_TRITON", raising=False)
    kernel, ref, installed, graphs = _kernel_then_torch_path(path, prompts)
    assert installed == 2 and graphs, (installed, graphs)
    agreed = 0
    for got, want in zip(kernel, ref):
        g, w = got.outputs[0], want.outputs[0]
        for i, (a, b) in enumerate(zip(g.token_ids, w.token_ids)):
            if a != b:
                top = sorted((lp.logprob for lp in w.logprobs[i].values()), reverse=True)
                margin = top[0] - top[1]
                assert margin < MARGIN, f"{arch} step {i}: kernel {a}, torch path {b}, clear margin {margin:.3f}"
                break
            assert abs(g.logprobs[i][a].logprob - w.logprobs[i][a].logprob) < 0.2
            agreed += 1
    assert agreed >= 16, f"{arch}: only {agreed} of 48 tokens compared before an ambiguous step"
