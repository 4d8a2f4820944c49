"""Greedy parity of the offline SDK with Hugging Face transformers on the real SmolLM2-135M-Instruct weights
(the embedded GGUF, dequantized to float32 by both: ``quantization="none"``; its default 4-bit path is
checked in tests/quant), under batching, chunked prefill, preemption and
prefix caching; seeded sampling independent of the batch; bad input raising ValueError while the engine
keeps serving."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams

pytestmark = pytest.mark.slow

NUM_NEW = 48
SYSTEM = ("You are a meticulous assistant for a team of engineers. Answer briefly, cite numbers when you "
          "have them, and say so when you do not know.")
RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three laws of thermodynamics are",
    "Water boils at",
    "In 1969, astronauts",
]
CHAT_QUESTIONS = [
    "What is a KV cache?",
    "Name three prime numbers.",
    "Write a haiku about autumn.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
]


@pytest.fixture(scope="module")
def gguf_path():
    from octavo.core.loader import default_model_path

    return default_model_path()


@pytest.fixture(scope="module")
def base_llm(gguf_path):
    return LLM(gguf_path, dtype="float32", quantization="none", seed=0)


@pytest.fixture(scope="module")
def prompts(base_llm):
    """12 prompts as token ids: 6 raw, 6 chat (with a shared system prompt, for prefix caching)."""
    tok = base_llm.get_tokenizer()
    out = [tok(p).input_ids for p in RAW_PROMPTS]
    for q in CHAT_QUESTIONS:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False).input_ids)
    return out


@pytest.fixture(scope="module")
def reference(gguf_path, prompts):
    """transformers greedy decoding (what generate(do_sample=False) does, minus its EOS masking) with raw
    logits, one prompt at a time (no padding effects)."""
    import os

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                 torch_dtype=torch.float32)
    model.eval()
    refs = []
    for ids in prompts:
        # A plain greedy loop over the raw logits: generate()'s min_new_tokens would mask EOS, while
        # ignore_eos only means "do not stop at EOS".
        tokens, lps = [], []
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True)
            for _ in range(NUM_NEW):
                lp = torch.log_softmax(out.logits[0, -1].float(), -1)
                t = int(lp.argmax())
                tokens.append(t)
                lps.append(lp[t].item())
                out = model(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)
        refs.append((tokens, lps))
    return refs


GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, logprobs=0)


def check_parity(outputs, reference):
    for out, (ref_tokens, ref_lps) in zip(outputs, reference):
        c = out.outputs[0]
        assert c.token_ids == ref_tokens
        got = [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]
        assert max(abs(a - b) for a, b in zip(got, ref_lps)) < 1e-4


def to_inputs(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def test_batched_greedy_parity(base_llm, prompts, reference):
    check_parity(base_llm.generate(to_inputs(prompts), GREEDY, use_tqdm=False), reference)


def test_chunked_prefill_parity(gguf_path, prompts, reference):
    llm = LLM(gguf_path, dtype="float32", quantization="none", max_num_batched_tokens=64, enable_prefix_caching=False)
    check_parity(llm.generate(to_inputs(prompts), GREEDY, use_tqdm=False), reference)


def test_preemption_parity(gguf_path, prompts, reference):
    # 40 blocks of 8 tokens: 12 requests of ~40-70 prompt tokens + 48 new tokens cannot all fit at once.
    llm = LLM(gguf_path, dtype="float32", quantization="none", num_gpu_blocks_override=40, block_size=8, enable_prefix_caching=False,
              max_num_seqs=4, kv_admission="greedy")  # 4 x ~115 tokens > 312 cached tokens: preempts (greedy admission)
    outs = llm.generate(to_inputs(prompts), GREEDY, use_tqdm=False)
    assert llm.llm_engine.get_stats().num_preemptions > 0
    check_parity(outs, reference)


def test_prefix_caching_parity(gguf_path, prompts, reference):
    llm = LLM(gguf_path, dtype="float32", quantization="none", enable_prefix_caching=True, block_size=16)
    # the first chat prompt fills the cache with the system prompt's blocks; the rest hit them
    first = llm.generate(to_inputs(prompts[6:7]), GREEDY, use_tqdm=False)
    rest = llm.generate(to_inputs(prompts[7:]), GREEDY, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    assert stats.prefix_cache_hits > 0
    assert all(o.num_cached_tokens > 0 for o in rest)
    check_parity(first + rest, reference[6:])


def test_seeded_sampling_is_batch_independent(base_llm, prompts):
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=42, max_tokens=24, ignore_eos=True)
    alone = base_llm.generate(to_inputs([prompts[0]]), p, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=24 + i, ignore_eos=True) for i in range(16)]
    batch = base_llm.generate(to_inputs(prompts[:12] + prompts[:4] + [prompts[0]]), others + [p], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone


def test_stop_strings_and_n(base_llm, prompts):
    tok = base_llm.get_tokenizer()
    ref = base_llm.generate(to_inputs([prompts[0]]), SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    text = ref[0].outputs[0].text
    stop = text[5:9]
    out = base_llm.generate(to_inputs([prompts[0]]), SamplingParams(temperature=0, max_tokens=20, stop=stop),
                            use_tqdm=False)[0].outputs[0]
    assert out.text == text[: text.index(stop)] and out.finish_reason == "stop" and out.stop_reason == stop
    many = base_llm.generate("Hello", SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=8), use_tqdm=False)
    assert len(many) == 1 and [c.index for c in many[0].outputs] == [0, 1, 2]
    assert tok.decode(many[0].outputs[0].token_ids, skip_special_tokens=True) == many[0].outputs[0].text


@pytest.mark.parametrize("bad, match", [
    (dict(prompt=""), "empty"),
    (dict(prompt={"prompt_token_ids": [1] * 9000}), "max_model_len"),
    (dict(prompt={"prompt_token_ids": [1, 10**7]}), "vocabulary"),
])
def test_bad_input_raises_and_engine_keeps_serving(base_llm, bad, match):
    with pytest.raises(ValueError, match=match):
        base_llm.generate(bad["prompt"], SamplingParams(max_tokens=4), use_tqdm=False)
    assert not base_llm.llm_engine.has_unfinished_requests()
    ok = base_llm.generate("Hi", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 4


def test_bad_params_in_a_batch_leave_nothing_running(base_llm):
    with pytest.raises(ValueError, match="logprobs"):
        base_llm.generate(["a", "b"], [SamplingParams(max_tokens=2), SamplingParams(logprobs=1000)],
                          use_tqdm=False)
    assert not base_llm.llm_engine.has_unfinished_requests()


def test_unknown_model_and_architecture(tmp_path):
    with pytest.raises(ValueError):
        LLM(str(tmp_path / "does-not-exist"))
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "model_type": "llama"}')
    with pytest.raises(ValueError, match="octavo plugins"):
        LLM(str(tmp_path), load_format="dummy", skip_tokenizer_init=True)


def test_prompt_logprobs_and_top_logprobs_match_transformers(gguf_path, base_llm, prompts):
    import os

    from transformers import AutoModelForCausalLM

    ids = prompts[6]
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                 torch_dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)  # [len, vocab]
    out = base_llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1, logprobs=5,
                                                                      prompt_logprobs=3), use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert abs(entry[ids[pos]].logprob - ref[pos - 1, ids[pos]].item()) < 1e-4
        top = ref[pos - 1].topk(3)
        for rank, (lp, tid) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            assert abs(entry[tid].logprob - lp) < 1e-4
            assert tid == ids[pos] or entry[tid].rank == rank
    first = out.outputs[0].logprobs[0]
    top = ref[-1].topk(5)
    assert list(first)[0] == out.outputs[0].token_ids[0] == top.indices[0].item()
    assert first[top.indices[0].item()].rank == 1
    assert set(top.indices.tolist()) <= set(first)
    assert all(first[t].decoded_token == base_llm.get_tokenizer().decode([t]) for t in first)


def test_llm_engine_streaming_abort_and_priority(gguf_path, base_llm):
    from octavo.sampling_params import RequestOutputKind

    engine = base_llm.llm_engine
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    engine.add_request("s", "Tell me a story about a robot", p)
    engine.add_request("x", "This one will be aborted", p)
    pieces, steps = [], 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        steps += 1
        if steps == 2:
            engine.abort_request("x")
            assert engine.get_stats().kv_cache_usage < 1.0
        pieces += [o.outputs[0].text for o in outs if o.request_id == "s"]
        assert all(o.request_id != "x" for o in outs) or steps <= 2
    final = base_llm.generate("Tell me a story about a robot", SamplingParams(temperature=0, max_tokens=16,
                                                                             ignore_eos=True), use_tqdm=False)
    assert "".join(pieces) == final[0].outputs[0].text
    assert engine.get_stats().kv_cache_usage == 0.0
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", "a", p)
        engine.add_request("dup", "b", p)
    engine.abort_request("dup")
