"""Real weights: with prefix caching on and int8 activations, a repeated greedy request gives the same tokens.

Why: session 5 made ``OCTAVO_CPU_INT8_ACT`` opt-in again because the same greedy chat request, sent twice to a
server with prefix caching, ended differently (tests/browser/test_chat_page.py): the second request's prompt
tail ran through another attention code path than the first request's fresh prefill, and int8 activations
turned the rounding difference into a near-tie flip. Now every ``cpu_paged`` row runs one kernel whose result
does not depend on chunking or caching (tests/unit/test_cpu_paged_invariance.py), and the int8-activation linears
are batch-invariant (test_cpu_int8act_batch_invariance.py). Here the embedded SmolLM2 Q4_1 GGUF runs the
browser test's chat request, then the same request again (a prefix-cache hit, checked), then inside a batch of
other prompts, then with a prompt that extends the cached one: the repeated answers must be the same tokens with
the same log-probabilities **bit for bit**: the platform's default dtype in ``make test``, the other of float32 /
bfloat16 too in ``make quant-full``.
"""

from __future__ import annotations

import os

import pytest

from octavo import LLM, SamplingParams
from octavo.core.loader import default_model_path
from octavo.plugins.attention import _cpu_paged_kernel
from octavo.plugins.quant import cpu_int8act_ops

pytestmark = pytest.mark.skipif(_cpu_paged_kernel.library() is None, reason="no C compiler for the CPU kernels")
CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"}]
OTHERS = [[{"role": "user", "content": p}] for p in ("Name three primary colors.", "What is 12 times 12?")]


@pytest.fixture(scope="module", params=["default", "other"])
def llm(request):
    """The platform's default dtype (bfloat16 where native, else float32); the other one with ``make quant-full``."""
    from octavo.plugins.platforms.cpu import CpuPlatform

    dtype = CpuPlatform().default_dtype()
    if request.param == "other":
        if not os.environ.get("OCTAVO_QUANT_FULL"):
            pytest.skip("the non-default dtype runs with `make quant-full` (OCTAVO_QUANT_FULL=1)")
        dtype = "float32" if dtype == "bfloat16" else "bfloat16"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OCTAVO_CPU_INT8_ACT", "1")
        mp.setattr(cpu_int8act_ops, "_state", {})
        if not cpu_int8act_ops.enabled():
            pytest.skip("int8-activation kernels not built here")
        engine = LLM(default_model_path(), dtype=dtype, enable_prefix_caching=True, max_num_seqs=8,
                     num_threads=2)
        assert engine.llm_engine.core.executor.driver.runner.attn_backend_cls.name == "cpu_paged"
        yield engine
        engine.llm_engine.shutdown()


def _answer(out):
    c = out.outputs[0]
    return list(c.token_ids), [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]


def test_repeated_chat_request_is_bitwise_the_same(llm):
    params = SamplingParams(temperature=0, max_tokens=32, logprobs=0)
    first = llm.chat([CHAT], params, use_tqdm=False)[0]
    again = llm.chat([CHAT], params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens > 0  # the second one hit the prefix cache
    batched = llm.chat([OTHERS[0], CHAT, *OTHERS[1:]], params, use_tqdm=False)[1]
    want = _answer(first)
    print("answer:", first.outputs[0].text, "| cached tokens:", again.num_cached_tokens)
    assert _answer(again) == want
    assert _answer(batched) == want
    assert len(want[0]) >= 3


def test_prompt_extending_a_cached_one_matches_its_fresh_run(llm):
    """A longer conversation whose start is cached gives, bit for bit, what it gives with the cache emptied."""
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=0)
    longer = CHAT + [{"role": "assistant", "content": "Paris."},
                     {"role": "user", "content": "And the capital of Italy, in one word?"}]
    llm.chat([CHAT], params, use_tqdm=False)  # caches the shared start
    warm = llm.chat([longer], params, use_tqdm=False)[0]
    assert warm.num_cached_tokens > 0
    assert llm.reset_prefix_cache()
    cold = llm.chat([longer], params, use_tqdm=False)[0]
    assert cold.num_cached_tokens == 0
    assert _answer(warm) == _answer(cold)
