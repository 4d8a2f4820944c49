"""The CUDA platform's own kernels reach a running engine through the ``Platform`` object (the core imports none):
a tiny random-weight Llama (fp32, CUDA graphs, async default) started by ``LLM`` gets ``make_fused_sampler()`` in
its runner's ``Sampler`` and ``make_grammar_mask_apply()`` as its mask apply; random rows really sample through
the fused kernel (counted), a seeded request gives the same tokens alone and inside a batch, and the runner's
mask apply on the device equals the host apply. Skips without a CUDA device (benchmarks/device/refactor.sh)."""

import json

import pytest

pytestmark = pytest.mark.gpu

TINY_LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=512,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                  max_position_embeddings=512, torch_dtype="bfloat16")


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from octavo import LLM

    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    engine = LLM(model=str(d), load_format="dummy", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
                 seed=0, dtype="float32", kv_cache_memory_bytes=256 << 20)  # fp32: batch shapes barely move logits
    yield engine
    engine.llm_engine.shutdown()


def _runner(llm):
    return llm.llm_engine.core.executor.driver.runner


def test_the_runner_holds_the_platforms_kernels(llm):
    from octavo.plugins.platforms.cuda_grammar_mask import apply_bitmask_
    from octavo.plugins.platforms.cuda_sampler import sample_rows

    runner = _runner(llm)
    assert runner.sampler.kernel is sample_rows
    assert runner.grammar_apply is apply_bitmask_


def test_random_rows_sample_through_the_fused_kernel_and_seeds_hold(llm):
    from octavo import SamplingParams

    sampler = _runner(llm).sampler
    calls, kernel = [], sampler.kernel
    sampler.kernel = lambda *a: calls.append(a[0].shape[0]) or kernel(*a)
    try:
        seeded = SamplingParams(max_tokens=12, temperature=0.9, seed=1234, ignore_eos=True)
        prompt = {"prompt_token_ids": [5, 17, 300, 42, 9]}
        alone = [list(llm.generate([prompt], seeded, use_tqdm=False)[0].outputs[0].token_ids) for _ in range(2)]
        others = [{"prompt_token_ids": [(7 * i + 3 * j) % 2000 + 1 for j in range(4 + 5 * i)]} for i in range(5)]
        outs = llm.generate(others + [prompt], [SamplingParams(max_tokens=12, temperature=0.7, ignore_eos=True)] * 5
                            + [seeded], use_tqdm=False)
    finally:
        sampler.kernel = kernel
    assert calls, "no step sampled through the platform's fused sampler"
    assert alone[0] == alone[1] and len(alone[0]) == 12
    assert list(outs[-1].outputs[0].token_ids) == alone[0]  # batch-independent


def test_the_runners_mask_apply_equals_the_host_apply(llm):
    import torch

    from octavo.core.grammar_step import apply_packed

    g = torch.Generator().manual_seed(3)
    vocab, rows = 2048 + 7, [1, 4, 5]
    logits = torch.randn(6, vocab, generator=g).to(torch.bfloat16)
    packed = torch.randint(-2**31, 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32, generator=g)
    host = apply_packed(logits.clone(), rows, packed)
    dev = apply_packed(logits.to("cuda"), rows, packed, kernel=_runner(llm).grammar_apply)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), host)
