"""``OCTAVO_DECODE_CONST_INPUTS`` (core/input_batch.py, session 16): a decode-only step's query starts and logits rows,
and an all-greedy batch's four sampler columns, come from kept device tensors instead of host copies, and the runner
skips the identity gather of the hidden rows. On the CPU the switch never applies (nothing is copied there), so these
tests force it (``const_inputs`` patched) and check that every value equals the copied one, that it applies only
where the values really are constant, and that a tiny engine's tokens do not change."""

from __future__ import annotations

import json

import pytest
import torch

from octavo.core import input_batch
from octavo.core.input_batch import CachedRequestState, build_sampling_batch, build_step_inputs
from octavo.sampling_params import SamplingParams
from octavo.step import NewRequestData, ScheduledRequestData, StepBatch

BS = 16
CPU = torch.device("cpu")


@pytest.fixture
def forced(monkeypatch):
    """Returns ``set(on)``: force the switch on the CPU device (restores the module's state after)."""
    monkeypatch.setattr(input_batch, "_CONST", {})
    state = {"on": False}
    monkeypatch.setattr(input_batch, "const_inputs", lambda device: state["on"])
    return lambda on: state.update(on=on)


def _batch(specs, states):
    """specs: (request id, tokens this step, computed before, samples)."""
    scheduled = []
    for rid, n, start, samples in specs:
        if rid not in states:
            states[rid] = CachedRequestState(NewRequestData(rid, list(range(1, start + n + 1)), SamplingParams()))
        blocks = list(range(1, (start + n) // BS + 2))
        scheduled.append(ScheduledRequestData(rid, list(range(7, 7 + n)), start, blocks, samples))
    decodes = sum(1 for _, n, _, _ in specs if n == 1)
    return StepBatch(scheduled, [], [], decodes, len(scheduled))


CASES = {  # name -> (specs, every logits row in order, query starts 0..n)
    "decode_bs1": ([("a", 1, 40, True)], True, True),
    "decode_bs4": ([(f"r{i}", 1, 20 + 17 * i, True) for i in range(4)], True, True),
    "prefill_then_decodes": ([("p", 5, 0, True), ("a", 1, 40, True)], False, False),
    "prefill_chunk_not_sampling": ([("p", 5, 0, False), ("a", 1, 40, True)], False, False),
    "decode_one_not_sampling": ([("a", 1, 40, False), ("b", 1, 50, True)], False, True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_inputs_equal_the_copied_ones(forced, name):
    specs, all_rows, arange_qsl = CASES[name]
    got = {}
    for on in (False, True):
        forced(on)
        states = {}
        got[on] = build_step_inputs(_batch(specs, states), states, BS, CPU)
    off, on = got[False], got[True]
    for field in ("input_ids", "positions", "query_start_loc", "logits_indices"):
        a, b = getattr(off, field), getattr(on, field)
        assert a.dtype == b.dtype and torch.equal(a, b), (name, field)
    assert off.logits_all_rows is False
    assert on.logits_all_rows is all_rows, name
    kept = input_batch._CONST
    assert ((CPU, "arange", torch.int32) in kept) is arange_qsl, name  # the kept starts only for one token a request
    if all_rows:
        assert on.logits_indices.data_ptr() == kept[(CPU, "arange", torch.int64)].data_ptr()


GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def _greedy_with(**fields):
    """A greedy row with a filter set after construction (SamplingParams drops a greedy row's filters, so only such a
    row can reach the sampler with one): its columns must be copied, not the kept defaults."""
    p = SamplingParams(temperature=0.0, max_tokens=4)
    for k, v in fields.items():
        setattr(p, k, v)
    return p


@pytest.mark.parametrize("params, const", [
    ([GREEDY], True),
    ([GREEDY] * 5, True),
    ([GREEDY, SamplingParams(temperature=0.0, top_k=5)], True),  # dropped by SamplingParams: the defaults
    ([GREEDY, SamplingParams(temperature=0.7, seed=1)], False),
    ([GREEDY, SamplingParams(temperature=0.7, top_k=5, seed=1)], False),
    ([_greedy_with(top_k=5)], False),
    ([GREEDY, _greedy_with(min_p=0.1)], False),
    ([_greedy_with(top_p=0.5)], False),
])
def test_greedy_columns_equal_the_copied_ones(forced, params, const):
    reqs = [CachedRequestState(NewRequestData(f"r{i}", [1, 2, 3], p)) for i, p in enumerate(params)]
    got = {}
    for on in (False, True):
        forced(on)
        got[on] = build_sampling_batch(reqs, 1000, CPU, {})
    for field in ("temperature", "top_p", "top_k", "min_p"):
        a, b = getattr(got[False], field), getattr(got[True], field)
        assert a.dtype == b.dtype and torch.equal(a, b), field
    for field in ("all_greedy", "no_top_p", "no_top_k", "no_min_p", "top_k_bound"):
        assert getattr(got[False], field) == getattr(got[True], field), field
    kept = (CPU, "greedy", len(params), 1000) in input_batch._CONST
    assert kept is const
    if const:  # the next step of the same size reads the same kept tensors (nothing copied)
        again = build_sampling_batch(reqs, 1000, CPU, {})
        assert again.temperature is got[True].temperature


TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            max_position_embeddings=256, torch_dtype="float32")


def test_engine_tokens_equal_with_const_inputs(forced, tmp_path):
    """The runner's path with the switch on (no gather of the hidden rows, kept starts and columns): greedy and
    seeded tokens of a tiny engine equal the plain path's, batch 1 and batch 4."""
    from octavo import LLM

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, max_model_len=128, max_num_seqs=4,
              seed=0, dtype="float32")
    try:
        prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 500 + 1 for j in range(3 + 5 * i)]} for i in range(4)]
        greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        seeded = [SamplingParams(max_tokens=12, temperature=0.9, seed=i, ignore_eos=True) for i in range(4)]

        def run():
            return [[list(o.outputs[0].token_ids) for o in llm.generate(p, s, use_tqdm=False)]
                    for p, s in ((prompts[:1], greedy), (prompts, greedy), (prompts, seeded))]

        forced(False)
        off = run()
        forced(True)
        on = run()
        assert all(len(t) == 12 for runs in off for t in runs)
        assert on == off
        assert any(k[1] == "greedy" for k in input_batch._CONST)  # the switch really ran
    finally:
        llm.llm_engine.shutdown()
