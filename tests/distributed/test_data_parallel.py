"""Data parallelism: two engine-core replicas behind one ``LLM`` give the single-engine greedy tokens and
logprobs, and spread the requests over both replicas."""

from __future__ import annotations

import pytest

from tests.distributed.test_tensor_parallel import PROMPTS, assert_same, full_only, make_checkpoint, run

pytestmark = full_only


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return make_checkpoint("llama", tmp_path_factory)


def test_dp2_equals_single_engine_and_uses_both_replicas(path):
    from octavo import LLM, SamplingParams

    want = run(path)
    assert_same(want, run(path, data_parallel_size=2))
    llm = LLM(path, dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128, data_parallel_size=2)
    try:
        core = llm.llm_engine.core
        for i, p in enumerate(PROMPTS * 2):
            llm.llm_engine.add_request(f"r{i}", {"prompt_token_ids": p}, SamplingParams(max_tokens=2))
        assert sorted(core.owner.values()) == [0, 0, 0, 1, 1, 1]  # load-aware: 3 each
        while llm.llm_engine.has_unfinished_requests():
            llm.llm_engine.step()
        assert not core.owner
    finally:
        llm.llm_engine.shutdown()
