"""Pipeline parallelism with several micro-batches in flight (core/pp_schedule.py) gives the single-process
tokens, and really keeps two micro-batches in flight.

One PP=2 engine (random-weight Llama, 2 layers: one per stage, ``mp`` executor, gloo; a CPU's default is one
batch in flight, so the test switches to two) on six requests of mixed
lengths (chunked prefill: a long prompt's chunks ride in consecutive micro-batches) with greedy tokens and
logprobs compared to the single process; then the same engine switched to one batch in flight gives the same
tokens. The executor's own ``execute_async`` is wrapped only to record how many steps were in flight when each
was sent.
"""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from octavo.core.pp_schedule import set_pipeline_depth
from tests.distributed.test_tensor_parallel import make_checkpoint

COMMON_KW = dict(dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128, max_num_batched_tokens=32, seed=0)

PROMPTS = [[5, 9, 30, 7], list(range(3, 50)), [11] * 20, [40, 41, 42], list(range(60, 90)), [7, 8]]
PARAMS = [SamplingParams(temperature=0, max_tokens=10 + i, logprobs=1, ignore_eos=True) for i in range(len(PROMPTS))]


def generate(llm):
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]) for o in outs]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from octavo import LLM

    path = make_checkpoint("llama", tmp_path_factory)
    single = LLM(path, **COMMON_KW)
    try:
        want = generate(single)
    finally:
        single.llm_engine.shutdown()
    llm = LLM(path, pipeline_parallel_size=2, **COMMON_KW)
    core = llm.llm_engine.core
    assert core.async_loop is None  # the CPU default: one batch in flight (core/pp_schedule.py pipeline_depth)
    set_pipeline_depth(core, 2)
    yield want, llm
    llm.llm_engine.shutdown()


def test_two_micro_batches_in_flight_equal_single_process(engines):
    want, llm = engines
    core = llm.llm_engine.core
    assert core.async_loop is not None and core.async_loop.depth == 2
    seen = []
    send = core.executor.execute_async

    def recording(batch, grammar=None):
        seen.append(len(core.async_loop.inflight))  # steps already in flight when this one is sent
        return send(batch, grammar)

    core.executor.execute_async = recording
    try:
        got = generate(llm)
    finally:
        del core.executor.execute_async
    assert max(seen) == 1  # two in flight at once, never more than depth
    for (w_ids, w_lp), (g_ids, g_lp) in zip(want, got, strict=True):
        assert g_ids == w_ids
        torch.testing.assert_close(torch.tensor(g_lp), torch.tensor(w_lp), atol=1e-4, rtol=0)


def test_one_batch_in_flight_gives_the_same_tokens(engines):
    want, llm = engines
    core = llm.llm_engine.core
    set_pipeline_depth(core, 1)
    try:
        assert core.async_loop is None
        assert [ids for ids, _ in generate(llm)] == [ids for ids, _ in want]
    finally:
        set_pipeline_depth(core, 2)
