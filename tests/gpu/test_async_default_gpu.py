"""Async scheduling is on by default on CUDA and changes no token: a tiny random-weight Llama (bf16, triton attention,
CUDA graphs), one engine started with the default, greedy tokens with async on vs switched off on the same engine
(docs/async_scheduling.md "Default"). Skips without a CUDA device."""

import json

import pytest

pytestmark = pytest.mark.gpu

TINY_LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=512,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                  max_position_embeddings=512, torch_dtype="bfloat16")


def run_default_vs_sync(model_dir: str, **kw) -> tuple[bool, list, list, int]:
    """(async resolved on?, tokens with the default, tokens after switching async off, graph replays)."""
    from octavo import LLM, SamplingParams
    from octavo.core.async_engine import set_async_scheduling

    llm = LLM(model=model_dir, load_format="dummy", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
              seed=0, **kw)
    try:
        core = llm.llm_engine.core
        on = bool(core.settings.scheduler.async_scheduling) and core.async_loop is not None
        prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 2000 + 1 for j in range(5 + 9 * i)]} for i in range(6)]
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        first = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        if on:
            set_async_scheduling(core, False)
        second = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        gr = core.executor.driver.runner.graph_runner
        return on, first, second, gr.num_replays if gr is not None else 0
    finally:
        llm.llm_engine.shutdown()


def test_async_default_on_cuda_and_tokens_identical(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    on, first, second, replays = run_default_vs_sync(str(tmp_path), dtype="bfloat16", kv_cache_memory_bytes=256 << 20)
    assert on, "async_scheduling=None should resolve to on for CUDA with the in-process executor"
    assert replays > 0  # decode steps replayed CUDA graphs, with the placeholders filled before the input copy
    assert all(len(t) == 24 for t in first)
    assert first == second
