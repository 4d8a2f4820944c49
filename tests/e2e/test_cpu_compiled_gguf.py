"""The compiled CPU decode step on the real embedded SmolLM2 Q4_1 GGUF, its 4-bit weights inside the graph.

Two forms of the GGUF linears inside the graph, each against the eager engine (the same process, the same
loaded model, fp32):

- int8 activations (the default, every row count since session 5, plugins/quant/cpu_int8act.py): each linear is one call of the
  op ``octavo_cpu::int4_a8`` / ``int8_a8``, the same C kernel eager runs. The graph's attention and norms round
  differently from the eager backend's (fp32 rounding), and an activation element near a rounding boundary of
  its int8 block then lands on the other integer, so the two runs agree to ~1e-2 in logprob, not 1e-5: the
  bound is 0.05 on the chosen tokens' logprobs, tokens compared while both runs still share a prefix.
- ``OCTAVO_CPU_INT8_ACT=0``: the exact fp32 form, written in tensor ops (``int4_linear_traced``) that inductor
  fuses, no extern call per linear: greedy tokens identical and chosen-token logprobs within 1e-3 (the fused
  sums run in another order than the C kernel's, so agreement is to fp32 rounding, not bit for bit).

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
    # torch_sdpa: the compiled step's attention is SDPA over the gathered cache, so the eager reference must use the
    # same attention math; the CPU default (cpu_paged, online softmax in C) sums in another order, and int8 activation
    # quantization turns those 1e-7 differences into rounding flips. What this module checks is the linears.
    # Likewise the eager norms, rotary and SiLU-and-mul: the CPU platform's C forms (same bits as torch for rotary
    # and SiLU, fp32 rounding for the norm) are off here, so the eager reference runs torch's ops as the graph does.
    with pytest.MonkeyPatch.context() as env:
        for switch in ("OCTAVO_CPU_C_NORM", "OCTAVO_CPU_FUSED_ROPE", "OCTAVO_CPU_FUSED_SILU"):
            env.setenv(switch, "0")
        llm = LLM(default_model_path(), dtype="float32", enable_prefix_caching=False, max_num_seqs=2, num_threads=1,
                  attention_backend="torch_sdpa")
    runner = llm.llm_engine.core.executor.driver.runner
    assert runner.graph_runner is None
    layers = [m for m in runner.model.modules() if hasattr(m, "quant_method") and hasattr(m, "w4")]
    assert len(layers) == 4 * 30  # qkv, o, gate_up, down of 30 layers are 4-bit (the int8 head runs outside the step)
    return llm, runner


def _greedy(llm: LLM) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=0)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
    return list(out.token_ids), [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]


@pytest.fixture(params=["int8act", "exact"])
def mode(request, monkeypatch):
    from octavo.plugins.quant import cpu_int8act_ops

    if request.param == "int8act":
        monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "1")  # the default (session 5: every row count)
    else:
        monkeypatch.setenv("OCTAVO_CPU_INT8_ACT", "0")
    monkeypatch.setattr(cpu_int8act_ops, "_state", {})
    if request.param == "int8act" and not cpu_int8act_ops.enabled():
        pytest.skip("int8-activation kernels not built here")
    torch._dynamo.reset()
    return request.param


def _compare(engine, backend: str, mode: str) -> None:
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
    diffs = [abs(a - b) for a, b in zip(want_lp, got_lp)]
    print(f"{mode}/{backend}: tokens {got_tokens} vs {want_tokens}, logprob diffs {[round(d, 5) for d in diffs]}")
    if mode == "exact":
        assert got_tokens == want_tokens
        assert max(diffs) < 1e-3
        return
    same = next((i for i, (a, b) in enumerate(zip(got_tokens, want_tokens)) if a != b), NEW)
    assert same >= NEW // 2  # a near tie may part them late, never early
    assert max(diffs[:same]) < 0.05


def test_4bit_step_traces_as_one_graph(engine, mode):
    _compare(engine, "eager", mode)


@pytest.mark.skipif(not FULL, reason="inductor compiles the step (minutes); run with `make cpu-compile`")
def test_4bit_step_compiled_by_inductor_matches_eager(engine, mode):
    _compare(engine, "inductor", mode)
