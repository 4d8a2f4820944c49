"""The compiled CPU decode step on the real embedded SmolLM2 Q4_1 GGUF, its 4-bit weights inside the graph.

Under ``torch.compile`` the int4 / int8 linears of a batch-1 step are written in tensor ops
(plugins/quant/cpu_kernel.py ``int4_linear_traced``) instead of the ctypes kernel, so the step is one graph
with no extern call per linear. Against the eager engine (the same process, the same loaded model, fp32
activations, the C kernels): greedy tokens identical and chosen-token logprobs within 1e-3 (the fused sums
run in another order than the C kernel's, so agreement is to fp32 rounding, not bit for bit).

``make test`` runs the bounded form: dynamo traces the step with ``backend="eager", fullgraph=True`` (a graph
break fails it; no C++ code generation, so seconds, not minutes) and runs it. ``make cpu-compile``
(``OCTAVO_CPU_COMPILE_TESTS=full``) also runs the inductor graph itself (minutes the first time).
"""

from __future__ import annotations

import os

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.core.loader import default_model_path
from octavo.plugins.platforms.cpu_compiled import CpuCompiledDecodeRunner
from octavo.plugins.quant import cpu_kernel

pytestmark = pytest.mark.skipif(cpu_kernel.library() is None, reason="no fp32 CPU quantization kernel here")
FULL = os.environ.get("OCTAVO_CPU_COMPILE_TESTS") == "full"
PROMPT = [1, 504, 3458, 282, 4649, 314, 216, 11, 1202, 30, 2, 198]  # a short chat-like prefix
NEW = 8


@pytest.fixture(scope="module")
def engine():
    llm = LLM(default_model_path(), dtype="float32", enable_prefix_caching=False, max_num_seqs=2, num_threads=1)
    runner = llm.llm_engine.core.executor.driver.runner
    assert runner.graph_runner is None
    layers = [m for m in runner.model.modules() if hasattr(m, "quant_method") and hasattr(m, "w4")]
    assert len(layers) == 4 * 30  # qkv, o, gate_up, down of 30 layers are 4-bit (the int8 head runs outside the step)
    return llm, runner


def _greedy(llm: LLM) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=0)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
    return list(out.token_ids), [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]


def _compare(engine, backend: str) -> None:
    llm, runner = engine
    want_tokens, want_lp = _greedy(llm)
    compiled = CpuCompiledDecodeRunner(runner.model, runner.block_size, 1, torch.float32, backend=backend,
                                       fullgraph=True)
    runner.graph_runner = compiled
    try:
        got_tokens, got_lp = _greedy(llm)
    finally:
        runner.graph_runner = None
    assert compiled.num_runs == NEW - 1  # every decode step ran in the graph (the first token is the prefill's)
    assert got_tokens == want_tokens
    assert max(abs(a - b) for a, b in zip(want_lp, got_lp)) < 1e-3


def test_4bit_step_traces_as_one_graph(engine):
    _compare(engine, "eager")


@pytest.mark.skipif(not FULL, reason="inductor compiles the step (minutes); run with `make cpu-compile`")
def test_4bit_step_compiled_by_inductor_matches_eager(engine):
    _compare(engine, "inductor")
