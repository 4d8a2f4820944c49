"""Cases for the Triton fused MoE kernel under Triton's CPU interpreter.

Not collected directly (no ``test_`` prefix): ``test_moe_triton_cpu.py`` runs this file with pytest in a
child process with ``TRITON_INTERPRET=1``, which must be set before any ``@triton.jit`` is defined. Shapes
are tiny (the interpreter runs each program in numpy): E=8, top_k=2, H=64, I=128 unless a case needs other.
"""

from __future__ import annotations

import os

import pytest
import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run through test_moe_triton_cpu.py"

from octavo.nn.fused_moe import FusedMoE  # noqa: E402
from octavo.plugins.platforms import cuda_moe  # noqa: E402
from octavo.plugins.platforms.cuda_moe_kernels import fused_experts, moe_align, padded_bound, topk_softmax  # noqa: E402
from tests.kernels.moe_oracle import INTER, SMALL, E, H, K, _layer, _reference, _routing, _weights  # noqa: E402


@pytest.mark.parametrize("n,num_experts,top_k,chunk,in_kernel", [
    (1, E, K, None, None), (5, E, K, None, None), (37, E, K, None, None), (37, 16, 3, 16, True),
    (37, 16, 3, 16, False), (9, 6, 2, None, True), (9, 6, 2, None, False)])
def test_align_groups_and_pads_by_expert(n, num_experts, top_k, chunk, in_kernel):
    """(37, 16, 3, 16) walks 111 slots in 16-slot chunks, so an expert's rank carries across chunks;
    (9, 6, 2): the sentinel id 6 lies inside the kernel's power-of-two expert lanes and must get no rows.
    ``in_kernel=False``: the counts of a large batch come from a scatter-add instead."""
    _, ids = _routing(n, num_experts, top_k)
    ids[0, 0] = num_experts  # expert parallelism's "held elsewhere": left out of the layout
    block_m, slots = 16, n * top_k
    sorted_slots, block_expert, total = moe_align(ids, num_experts, block_m, chunk, in_kernel)
    total = int(total)
    assert sorted_slots.numel() == padded_bound(slots, num_experts, block_m) >= total
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=num_experts + 1)[:num_experts]
    assert total == int(((counts + block_m - 1) // block_m * block_m).sum())
    seen = []
    for b in range(total // block_m):
        e = int(block_expert[b])
        rows = sorted_slots[b * block_m:(b + 1) * block_m].tolist()
        real = [s for s in rows if s < slots]
        assert all(s == slots for s in rows[len(real):]), "padding only after an expert's slots"
        assert all(int(flat[s]) == e for s in real)
        seen += real
    want = [s for e in range(num_experts) for s in range(slots) if int(flat[s]) == e]  # by expert, token order
    assert seen == want


@pytest.mark.parametrize("dtype,n", [(torch.float32, 5), (torch.float16, 1), (torch.float16, 5),
                                     (torch.float16, 37), (torch.bfloat16, 1), (torch.bfloat16, 37)])
def test_fused_experts_matches_float64(dtype, n):
    w13, w2 = _weights(dtype)
    weights, ids = _routing(n)
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(2)).to(dtype)
    got = fused_experts(x, w13, w2, weights, ids, SMALL).double()
    want = _reference(x, w13, w2, weights, ids)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}[dtype]
    assert got.shape == (n, H) and (got - want).abs().max() <= tol * want.abs().max()


@pytest.mark.parametrize("num_experts,top_k,renormalize,dtype", [
    (8, 2, True, torch.float32), (128, 8, True, torch.bfloat16), (6, 3, False, torch.float32),
    (16, 1, False, torch.float16)])
def test_routing_kernel_matches_select_experts(num_experts, top_k, renormalize, dtype):
    """Softmax + top-k + renormalise in one launch against ``FusedMoE.select_experts`` (E not a power of
    two, k not a power of two, k=1; bf16/fp16 logits are read as float32 like the torch path's ``.float()``)."""
    layer = FusedMoE(num_experts, top_k, H, INTER, renormalize=renormalize)
    gen = torch.Generator().manual_seed(7)
    # distinct values in each row, exact in every dtype (steps of 1/16): a tie's winner is not specified
    logits = torch.stack([torch.randperm(num_experts, generator=gen) for _ in range(16)])
    logits = (logits.float() / 16 - 2).to(dtype)
    want_w, want_ids = layer.select_experts(logits)
    got_w, got_ids = topk_softmax(logits, top_k, renormalize)
    assert got_ids.dtype == torch.int64 and got_w.dtype == torch.float32
    assert torch.equal(got_ids, want_ids)
    assert (got_w - want_w).abs().max() <= 1e-6


def test_batch_one_direct_layout_equals_aligned():
    """One token skips the align launch (each slot its own block); the aligned path on the same token (run
    as a batch whose other rows are copies) gives the same row bit for bit."""
    w13, w2 = _weights(torch.float16)
    weights, ids = _routing(1)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(8)).to(torch.float16)
    one = fused_experts(x, w13, w2, weights, ids, SMALL)
    many = fused_experts(x.expand(3, H).contiguous(), w13, w2, weights.expand(3, K).contiguous(),
                         ids.expand(3, K).contiguous(), SMALL)
    assert torch.equal(one[0], many[0]) and torch.equal(many[0], many[2])


def test_ragged_shapes_and_separate_w2_tiles():
    """H and I not multiples of the tiles, top_k=3 over 5 experts, and a w2 config of its own."""
    e, k, h, inter, n = 5, 3, 40, 72, 11
    w13, w2 = _weights(torch.float16, e, h, inter)
    weights, ids = _routing(n, e, k)
    x = torch.randn(n, h, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    got = fused_experts(x, w13, w2, weights, ids, {**SMALL, "BLOCK_N": 64},
                        w2_config={"BLOCK_N": 16, "BLOCK_K": 64, "GROUP_M": 1}).double()
    want = _reference(x, w13, w2, weights, ids)
    assert (got - want).abs().max() <= 2e-3 * want.abs().max()


def test_expert_parallel_ids_held_elsewhere_count_zero():
    n = 6
    w13, w2 = _weights(torch.float16)
    weights, ids = _routing(n)
    ids[::2, 1] = E  # another rank's expert, weight 0 as FusedMoE.forward sets it
    weights[::2, 1] = 0.0
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(4)).to(torch.float16)
    got = fused_experts(x, w13, w2, weights, ids, SMALL, zero_missing=True).double()
    want = _reference(x, w13, w2, weights, ids)
    assert (got - want).abs().max() <= 2e-3 * want.abs().max()


@pytest.mark.parametrize("n", [1, 13])
def test_installed_layer_matches_torch_path(n):
    """Through ``FusedMoE.forward`` (routing included): the kernel against the layer's own grouped torch path."""
    layer = _layer(torch.bfloat16, renormalize=False)
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    logits = torch.randn(n, E, generator=torch.Generator().manual_seed(6))
    want = layer(x, logits).float()
    notes = cuda_moe.install_moe_kernels(layer, torch.bfloat16, torch.device("cpu"))
    assert notes["triton"] == 1 and "apply_experts" in layer.__dict__ and "select_experts" in layer.__dict__
    got = layer(x, logits).float()
    assert (got - want).abs().max() <= 3e-2 * want.abs().max()


def test_install_refuses_what_it_cannot_run(monkeypatch):
    layer = _layer(torch.float32)
    notes = cuda_moe.install_moe_kernels(layer, torch.float32, torch.device("cpu"))
    assert notes["triton"] == 0 and "float32" in notes["reasons"]["mlp.experts"]
    assert "apply_experts" not in layer.__dict__ and "select_experts" not in layer.__dict__
    gelu = FusedMoE(E, K, H, INTER, activation="gelu", prefix="gelu.experts")
    gelu.w13_weight.data, gelu.w2_weight.data = _weights(torch.float16)
    assert "SiLU" in cuda_moe.install_moe_kernels(gelu, torch.float16, torch.device("cpu"))["reasons"]["gelu.experts"]
    monkeypatch.setenv("OCTAVO_MOE_TRITON", "0")
    layer = _layer(torch.float16)
    notes = cuda_moe.install_moe_kernels(layer, torch.float16, torch.device("cpu"))
    assert notes["triton"] == 0 and notes["reasons"]["all"] == "OCTAVO_MOE_TRITON=0"
    assert "apply_experts" not in layer.__dict__


def test_tuner_writes_a_config_file_the_layer_reads(tmp_path, monkeypatch):
    """benchmarks/moe_tune.py's search and file writing, with a fake timer (the interpreter has no GPU clock)."""
    import importlib.util
    import random
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("moe_tune", Path(__file__).parents[2] / "benchmarks/moe_tune.py")
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    rng = random.Random(0)

    def fake_bench(fn):
        fn()  # the kernel really runs once per candidate (interpreted)
        return rng.uniform(1, 2)

    monkeypatch.setattr(tune, "_bench", fake_bench)
    monkeypatch.setattr(tune, "candidates", lambda bm, gated, full: [
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2} for bn in (16, 32)])
    report = tune.tune_shape(E, K, H, INTER, [1, 6], torch.float16, out_dir=tmp_path, device="cpu")
    assert set(report) == {1, 6} and all(r["gemm_us"] <= r["default_gemm_us"] for r in report.values())
    monkeypatch.setenv("OCTAVO_MOE_CONFIG_DIR", str(tmp_path))
    cuda_moe.load_configs.cache_clear()
    table = cuda_moe.load_configs(E, INTER, "cpu", torch.float16)
    assert sorted(table) == [1, 6]
    layer = _layer(torch.float16)
    cuda_moe.use_triton_kernel(layer)
    x = torch.randn(3, H).to(torch.float16)
    w, ids = _routing(3)
    got = layer.apply_experts(x, w, ids).double()
    assert layer._moe_cfg_cache[3][0]["BLOCK_N"] == table[1]["BLOCK_N"]
    want = _reference(x, layer.w13_weight, layer.w2_weight, w, ids)
    assert (got - want).abs().max() <= 2e-3 * want.abs().max()
    cuda_moe.load_configs.cache_clear()


def test_tiny_mixtral_through_llm_same_tokens(tmp_path, monkeypatch):
    """The kernel inside a real engine step (CPU, fp32 so both paths agree to ~1e-6): a tiny random Mixtral
    through ``LLM``, torch path first, then every ``FusedMoE`` switched to the kernel; greedy tokens equal.
    Two requests decode through the general kernel, one request alone through the batch-1 two-launch path."""
    import transformers as T

    from octavo import LLM, SamplingParams

    cfg = T.MixtralConfig(architectures=["MixtralForCausalLM"], vocab_size=128, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                          num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    T.MixtralForCausalLM(cfg).save_pretrained(tmp_path)
    llm = LLM(model=str(tmp_path), dtype="float32", skip_tokenizer_init=True, max_model_len=32, seed=0,
              kv_cache_memory_bytes=1 << 20, enable_prefix_caching=False, attention_backend="torch_sdpa")
    model = llm.llm_engine.core.executor.driver.runner.model
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    params = SamplingParams(max_tokens=3, temperature=0, logprobs=1, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 17, 33, 2, 90, 64]}, {"prompt_token_ids": [7]}]
    want = llm.generate(prompts, params, use_tqdm=False)
    from octavo.plugins.platforms import cuda_moe_kernels

    calls = []
    monkeypatch.setattr(cuda_moe_kernels, "fused_experts", lambda *a, **k: calls.append(1) or fused_experts(*a, **k))
    for layer in layers:
        cuda_moe.use_triton_kernel(layer)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert len(layers) == 2 and len(calls) == 2 * 3  # 2 layers x (1 prefill + 2 decode steps)
    # one request alone: its decode steps (one token) take the two-launch batch-1 path
    decode_calls = []
    for layer in layers:
        real = layer._moe_decode
        layer._moe_decode = lambda *a, real=real: decode_calls.append(1) or real(*a)
    got.append(llm.generate(prompts[:1], params, use_tqdm=False)[0])
    assert len(decode_calls) == 2 * 2  # 2 layers x 2 decode steps
    for g, w in zip(got, want + want[:1]):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for step, tok in enumerate(g.outputs[0].token_ids):
            assert abs(g.outputs[0].logprobs[step][tok].logprob - w.outputs[0].logprobs[step][tok].logprob) < 1e-4
