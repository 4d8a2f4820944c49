"""Session 16's batch-1 levers outside the graph on a CUDA GPU (skips without one): the eager greedy argmax in two
launches (cuda_argmax.greedy_argmax, ``OCTAVO_CUDA_GREEDY_ARGMAX``) gives torch.argmax's answers on vocabulary-sized
rows, and a tiny random-weight Llama (bf16, CUDA graphs, async scheduling) gives the same greedy, seeded and top-k
tokens with the kept decode inputs (``OCTAVO_DECODE_CONST_INPUTS``) and that argmax on as off, in one engine, its decode
steps replayed from graphs and the argmax really called; and the one-graph batch-1 greedy step (``OCTAVO_GRAPH_STEP``)
gives the plain path's tokens."""

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


@pytest.mark.parametrize("async_scheduling, head_graphs", [(True, "0"), (False, "1")])
def test_engine_tokens_equal_with_the_step_graph(tmp_path, monkeypatch, async_scheduling, head_graphs):
    """The one-graph batch-1 greedy step (cuda_step_graph.py, OCTAVO_GRAPH_STEP=1, with the head graphs or its own
    GraphHead): captured, replayed for every batch-1 greedy decode step (its id read on the device from the previous
    step's ids under async scheduling, the host's otherwise), the same tokens as the body graph + eager head, with its
    row copied in and its id copied out, and zero-copy (OCTAVO_GRAPH_STEP_ZERO_COPY=1: the row read from pinned host
    memory and the id written there by the graphs), and with the copy graph's argmax of the raw 16-bit logits
    (OCTAVO_GRAPH_STEP_RAW_ARGMAX, recaptured at run time); batch 3 and seeded steps do not take it."""
    from octavo import LLM, SamplingParams

    monkeypatch.setenv("OCTAVO_GRAPH_HEAD", head_graphs)
    monkeypatch.setenv("OCTAVO_GRAPH_STEP", "1")
    monkeypatch.setenv("OCTAVO_GRAPH_STEP_ZERO_COPY", "1")
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
              seed=0, dtype="bfloat16", kv_cache_memory_bytes=256 << 20, async_scheduling=async_scheduling)
    try:
        gr = llm.llm_engine.core.executor.driver.runner.graph_runner
        sg, head = gr.step_graph, gr.head
        assert sg is not None and sg.graph is not None, "the one-graph step was not captured"
        assert len(sg.zc_graphs) == 4, "the zero-copy step graphs were not captured"
        assert (head is None) == (head_graphs == "0") and (head is None or sg.head is head)
        prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 2000 + 1 for j in range(5 + 9 * i)]} for i in range(3)]
        greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)  # crosses block boundaries
        cases = {"greedy1": ([prompts[2]], greedy, True), "greedy3": (prompts, greedy, False),
                 "seeded1": ([prompts[1]], SamplingParams(max_tokens=16, temperature=0.8, seed=3, ignore_eos=True),
                             False)}
        for name, (ps, params, uses) in cases.items():
            got = {}
            for mode in ("off", "copy", "zero_copy", "raw"):
                sg.active, sg.zero_copy = mode != "off", mode == "zero_copy"
                if head is not None:
                    head.active = False
                if sg.raw != (mode == "raw"):  # copy: the float cast + copy node; raw: the argmax of the head's
                    sg.raw = mode == "raw"       # 16-bit logits into the id buffer (RAW_ARGMAX); recaptured
                    sg.capture(gr.pool)
                if mode == "raw":
                    assert sg.raw_logits is not None, "compute_logits is the head's cast here: raw must act"
                before, prev = sg.replays, sg.from_prev
                outs = llm.generate(ps, params, use_tqdm=False)
                got[mode] = ([list(o.outputs[0].token_ids) for o in outs], sg.replays - before, sg.from_prev - prev)
            for mode in ("copy", "zero_copy", "raw"):
                assert got[mode][0] == got["off"][0], (name, mode)
            assert got["off"][1] == 0
            for mode in ("copy", "zero_copy", "raw"):
                if uses:
                    assert got[mode][1] >= params.max_tokens - 2, (name, mode, got[mode])
                    assert (got[mode][2] >= params.max_tokens - 3) if async_scheduling else got[mode][2] == 0, got[mode]
                else:
                    assert got[mode][1] == 0, (name, mode, got[mode])
    finally:
        llm.llm_engine.shutdown()


def test_engine_tokens_equal_with_const_inputs_and_argmax(tmp_path, monkeypatch):
    from octavo import LLM, SamplingParams
    from octavo.core import input_batch
    from octavo.plugins.platforms import cuda_argmax

    monkeypatch.setenv("OCTAVO_GRAPH_STEP", "0")  # the eager head's levers: batch-1 greedy steps run it too
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    saved = input_batch.CONST_INPUTS
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8,
              seed=0, dtype="bfloat16", kv_cache_memory_bytes=256 << 20)
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
