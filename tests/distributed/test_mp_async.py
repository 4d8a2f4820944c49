"""Async scheduling through the ``mp`` executor (tensor parallelism on CPU, gloo) gives the tokens of the
synchronous engine.

Under async scheduling the engine core sends step N+1 before it has step N's tokens; each rank fills the
placeholders from its own device copy of the sampled ids (broadcast from tp rank 0: core/tp_comm.py) and
answers through a reply thread (plugins/executors/mp_replies.py). One TP=2 engine (random-weight Llama, 2
worker processes) is started with ``async_scheduling=True`` and checked against the single-process synchronous
run (greedy tokens, logprobs and prompt logprobs within 1e-4, chunked prefill), then switched between modes
while idle to compare seeded sampling with penalties and a structured (choice) request token for token.
"""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.structured_outputs import StructuredOutputsParams
from tests.distributed.test_tensor_parallel import PARAMS, PROMPTS, assert_same, make_checkpoint, run

COMMON = dict(dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128, max_num_batched_tokens=32, seed=0)


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """(single-process synchronous results, a TP=2 mp engine started with async scheduling)"""
    path = make_checkpoint("llama", tmp_path_factory)
    want = run(path)
    llm = LLM(path, tensor_parallel_size=2, async_scheduling=True, **COMMON)
    yield want, llm
    llm.llm_engine.shutdown()


def _generate(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _use(llm, on: bool):
    from octavo.core.async_engine import set_async_scheduling

    set_async_scheduling(llm.llm_engine.core, on)
    assert (llm.llm_engine.core.async_loop is not None) == on


def test_tp2_async_equals_single_process(tp2):
    want, llm = tp2
    core = llm.llm_engine.core
    assert core.executor.name == "mp" and core.async_loop is not None
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    got = []
    for o in outs:
        c = o.outputs[0]
        lps = [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]
        plps = [next(iter(e.values())).logprob for e in (o.prompt_logprobs or [])[1:] if e]
        got.append((list(c.token_ids), lps, plps))
    assert_same(want, got)
    timers = core.step_timers.as_dict()
    assert timers["overlapped_s"] > 0  # steps really were in flight while the core scheduled the next one


def test_tp2_async_seeded_sampling_and_penalties_equal_sync(tp2):
    _, llm = tp2
    prompts = [[5, 9, 30, 7], list(range(3, 40)), [11] * 20, [40, 41]]
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=12, ignore_eos=True,
                             repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2)
              for i in range(len(prompts))]
    params[1] = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)  # finishes early: an extra step
    _use(llm, False)
    sync = _generate(llm, prompts, params)
    _use(llm, True)
    assert _generate(llm, prompts, params) == sync


def test_tp2_async_structured_choice_equals_sync(tp2):
    _, llm = tp2
    params = [SamplingParams(temperature=0, max_tokens=4,
                             structured_outputs=StructuredOutputsParams(choice=["w7 w8", "w9"])),
              SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)]
    prompts = [[5, 9, 30, 7], list(range(3, 20))]
    _use(llm, False)
    sync = _generate(llm, prompts, params)
    _use(llm, True)
    assert _generate(llm, prompts, params) == sync
    assert llm.get_tokenizer().decode(sync[0], skip_special_tokens=True) in ("w7 w8", "w9")


def test_gated_grammar_steps_tell_the_executor_when_they_open():
    """The mp executor holds a structured step until its gate opens (``is_released``); without the method it
    would fill a closed gate and wait forever, so a lost method must fail here, fast, not hang the suite."""
    from octavo.core.async_engine import GatedGrammarStep

    assert callable(getattr(GatedGrammarStep, "is_released", None))
