"""One pinned host-to-device copy per step (core/step_staging.py, ``OCTAVO_STEP_STAGING``) on a CUDA GPU (skips
without one): staged arrays equal the plain copies, also while the GPU lags behind the host by more than the ring;
and a tiny random-weight Llama (bf16, CUDA graphs, async scheduling) gives the same greedy and seeded-sampling
tokens with staging off and on in one engine, its decode steps replayed from graphs with the staged rows."""

import json

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _arrays(rng, step):
    n = 1 + step % 5
    return [rng.integers(-2**40, 2**40, n, dtype=np.int64), rng.integers(0, 2**31 - 1, (n, 3 + step % 4), dtype=np.int32),
            rng.standard_normal(n).astype(np.float32), rng.integers(0, 2, n).astype(np.bool_), np.empty(0, np.int64)]


def test_staged_views_equal_the_plain_copies_over_the_ring():
    from octavo.core.step_staging import SLOTS, PinnedStaging

    dev = torch.device("cuda")
    st = PinnedStaging(dev)
    rng = np.random.default_rng(0)
    torch.cuda._sleep(200_000_000)  # the GPU lags: the first copies wait behind it, later stages reuse slots
    kept = []
    for step in range(3 * SLOTS):
        arrays = _arrays(rng, step)
        views = st.stage(arrays)
        kept.append(([a.copy() for a in arrays], views))
        for a in arrays:  # the caller may reuse its arrays at once: stage() copied them
            a.fill(0)
    torch.cuda.synchronize()
    for arrays, views in kept[-SLOTS:]:  # a view is valid until its slot comes round again
        for a, v in zip(arrays, views):
            assert v.dtype == torch.from_numpy(a).dtype and tuple(v.shape) == a.shape
            assert torch.equal(v.cpu(), torch.from_numpy(a))
    assert st.copies == 3 * SLOTS


TINY_LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=512,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                  max_position_embeddings=512, torch_dtype="bfloat16")


def test_engine_tokens_equal_with_staging_off_and_on(tmp_path):
    from octavo import LLM, SamplingParams
    from octavo.core import input_batch

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    saved = input_batch.STAGING
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
              seed=0, dtype="bfloat16", kv_cache_memory_bytes=256 << 20)
    try:
        core = llm.llm_engine.core
        prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 2000 + 1 for j in range(5 + 9 * i)]} for i in range(6)]
        greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        seeded = [SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=i, ignore_eos=True)
                  for i in range(6)]
        one = [prompts[0]]  # batch 1 decode: the MoE headline's shape of step

        def run():
            return [[list(o.outputs[0].token_ids) for o in llm.generate(p, s, use_tqdm=False)]
                    for p, s in ((prompts, greedy), (prompts, seeded), (one, greedy))]

        input_batch.STAGING = False
        off = run()
        input_batch.STAGING = True
        gr = core.executor.driver.runner.graph_runner
        replays = gr.num_replays
        on = run()
        stager = input_batch.step_staging(core.executor.driver.runner.device)
        assert stager is not None and stager.copies > 0
        assert gr.num_replays > replays  # decode steps replayed graphs from the staged rows
        assert all(len(t) == 24 for runs in off for t in runs)
        assert on == off
    finally:
        input_batch.STAGING = saved
        llm.llm_engine.shutdown()
