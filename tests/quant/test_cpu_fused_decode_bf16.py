"""The fused batch-1 CPU decode stack with a bfloat16 model (the CPU default dtype where bf16 is native): the
bf16 norm weights and embedding are read as bf16, the hidden state is rounded to bf16 where the per-op path
rounds it, bf16 q goes to the paged kernel and bf16 comes back, K/V are written into a bf16 cache rounded to
nearest even (plugins/platforms/cpu_fused_decode_src.py).

Against the per-op bf16 path of the same loaded model, step by step as in test_cpu_fused_decode.py (fp32):
every step's hidden state and K/V rows are the same bits, and so are the greedy tokens and logprobs.
"""

from __future__ import annotations

import pytest
import torch

from octavo import LLM
from octavo.core.loader import default_model_path
from octavo.plugins.platforms import cpu_fused_decode
from octavo.plugins.platforms.cpu_fused_decode import CpuFusedDecodeRunner
from octavo.plugins.quant import cpu_int8act_ops
from tests.quant.test_cpu_fused_decode import NEW, _Both, _greedy

pytestmark = pytest.mark.skipif(cpu_fused_decode.library() is None or not cpu_int8act_ops.enabled(),
                                reason="fused decode / int8-activation kernels cannot be built here")


@pytest.fixture(scope="module")
def engine():
    llm = LLM(default_model_path(), dtype="bfloat16", enable_prefix_caching=False, max_num_seqs=2, num_threads=1)
    runner = llm.llm_engine.core.executor.driver.runner
    layer = runner.model.model.layers[0]
    assert layer.self_attn.attn.kv_cache.dtype == torch.bfloat16 and layer.input_layernorm.weight.dtype == torch.bfloat16
    assert cpu_fused_decode.same_bits_reason(runner.model, torch.bfloat16) is None
    runner.graph_runner = None  # the per-op path
    yield llm, runner
    runner.graph_runner = None


def test_bf16_steps_and_greedy_tokens_are_bitwise_per_op(engine):
    llm, runner = engine
    (want, want_lp), = _greedy(llm)
    both = _Both(runner, torch.bfloat16)
    runner.graph_runner = both
    try:
        _greedy(llm)
        assert len(both.diffs) == NEW - 1
        assert both.equal == [True] * (NEW - 1), both.diffs
        fused = CpuFusedDecodeRunner(runner.model, torch.bfloat16)
        runner.graph_runner = fused
        (got, got_lp), = _greedy(llm)
        assert fused.num_runs == NEW - 1
    finally:
        runner.graph_runner = None
    assert (got, got_lp) == (want, want_lp)
