"""Session 16's batch-1 levers outside the graph on a CUDA GPU (skips without one): the eager greedy argmax in two
launches (cuda_argmax.greedy_argmax, ``OCTAVO_CUDA_GREEDY_ARGMAX``) gives torch.argmax's answers on vocabulary-sized
rows, and a tiny random-weight Llama (bf16, CUDA graphs, async scheduling) gives the same greedy, seeded and top-k
tokens with the kept decode inputs (``OCTAVO_DECODE_CONST_INPUTS``) and that argmax on as off, in one engine, its decode
steps replayed from graphs and the argmax really called."""

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_greedy_argmax_equals_torch_argmax():
    from octavo.plugins.platforms.cuda_argmax import SMALL_ROWS, greedy_argmax

    g = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 2, 3, SMALL_ROWS, SMALL_ROWS + 1):
        x = torch.randn(rows, 128256, device="cuda", generator=g)
        x[0, 1000] = x[0, 90000] = x[0].max() + 1  # a tie: the first index wins
        if rows > 1:
            x[1, 77] = float("nan")
        if rows > 2:
            x[2] = torch.round(x[2])  # many ties
        assert torch.equal(greedy_argmax(x), x.argmax(dim=-1)), rows


TINY_LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=512,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                  max_position_embeddings=512, torch_dtype="bfloat16")


def test_engine_tokens_equal_with_const_inputs_and_argmax(tmp_path):
    from octavo import LLM, SamplingParams
    from octavo.core import input_batch
    from octavo.plugins.platforms import cuda_argmax

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    saved = input_batch.CONST_INPUTS
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
              seed=0, dtype="bfloat16", gpu_memory_utilization=0.2)
    try:
        runner = llm.llm_engine.core.executor.driver.runner
        prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 2000 + 1 for j in range(5 + 9 * i)]} for i in range(6)]
        greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        seeded = [SamplingParams(max_tokens=24, temperature=0.8, top_k=50, seed=i, ignore_eos=True) for i in range(6)]
        calls = {"n": 0}

        def counted(logits):
            calls["n"] += 1
            return cuda_argmax.greedy_argmax(logits)

        def run():
            return [[list(o.outputs[0].token_ids) for o in llm.generate(p, s, use_tqdm=False)]
                    for p, s in (([prompts[0]], greedy), (prompts, greedy), (prompts, seeded))]

        input_batch.CONST_INPUTS, runner.sampler.greedy_argmax = False, None
        off = run()
        input_batch.CONST_INPUTS, runner.sampler.greedy_argmax = True, counted
        replays = runner.graph_runner.num_replays
        on = run()
        assert runner.graph_runner.num_replays > replays
        assert calls["n"] > 24  # every greedy step of batch 1 and batch 6 took it
        assert any(k[1] == "greedy" for k in input_batch._CONST)
        assert all(len(t) == 24 for runs in off for t in runs)
        assert on == off
    finally:
        input_batch.CONST_INPUTS = saved
        llm.llm_engine.shutdown()
