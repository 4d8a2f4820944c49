"""Sleep mode with the fused CPU batch-1 decode (the default for the embedded GGUF since session 7).

The fused stack keeps raw addresses of the weights and the KV cache in a C struct, but checks them at every step and
rebuilds the struct when a tensor moved (plugins/platforms/cpu_fused_decode.py ``_stale``), so it declares
``holds_addresses = False`` and sleep mode is allowed. This checks the claim end to end on the real GGUF: greedy tokens
and logprobs after sleep level 1 (KV cache freed) and level 2 (weights discarded and reloaded from the file) + wake up
are exactly those before, and the batch-1 steps really ran the fused stack.
"""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.core.loader import default_model_path
from octavo.plugins.platforms.cpu_fused_decode import CpuFusedDecodeRunner, library

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler for the fused CPU decode here")
PROMPT = [1, 504, 3458, 282, 4649, 314, 216, 11, 1202, 30, 2, 198]


def _greedy(llm: LLM) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
    return list(out.token_ids), [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]


def test_sleep_and_wake_keep_the_fused_tokens():
    llm = LLM(default_model_path(), enable_sleep_mode=True, enable_prefix_caching=False, max_num_seqs=2)
    fused = llm.llm_engine.core.executor.driver.runner.graph_runner
    assert isinstance(fused, CpuFusedDecodeRunner) and fused.holds_addresses is False
    want = _greedy(llm)
    runs = fused.num_runs
    assert runs >= 7  # every decode step of the single request ran the fused stack
    for level in (1, 2):
        llm.sleep(level=level)
        llm.wake_up()
        assert _greedy(llm) == want, f"after sleep level {level}"
    assert fused.num_runs >= runs + 14
