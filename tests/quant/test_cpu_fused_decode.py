"""The fused batch-1 CPU decode stack (plugins/platforms/cpu_fused_decode.py) on the real embedded SmolLM2 GGUF.

Against the per-op path in the same process and the same loaded model. The fused stack computes the per-op
path's bits (the linears and the attention are the same C kernels; norms run cpu_norm's row arithmetic on both
paths, rotary / SiLU-and-mul copy cpu_rope's / cpu_silu's, and the hidden state is rounded to the model dtype
where the per-op path rounds it), so everything here is BITWISE:

- every decode step's final hidden state equals the per-op forward of the same step (same inputs, same cache;
  the fused step runs at 2 threads, the per-op forward right after it at the engine's 1), and so do the K/V rows
  the step wrote into every layer's cache (the per-op forward rewrites them);
- greedy tokens and chosen-token logprobs with the fused runner as the engine's step runner equal the per-op
  run's; a batch of two still runs per-op (the runner takes only single-request decode steps);
- the default: with ``OCTAVO_CPU_FUSED_DECODE`` unset the engine runs the fused stack (same bits), ``0`` = per-op;
- the switch and the refusals: a bad value, ``1`` on a model it cannot run, and the reason for a non-Llama model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.core.loader import default_model_path
from octavo.errors import ConfigError
from octavo.model import ForwardContext
from octavo.platform import ModelHandle, PreparedModel
from octavo.plugins.platforms import cpu_fused_decode, cpu_fused_decode_setup
from octavo.plugins.platforms.cpu_fused_decode import CpuFusedDecodeRunner
from octavo.plugins.quant import cpu_int8act_ops

pytestmark = pytest.mark.skipif(cpu_fused_decode.library() is None or not cpu_int8act_ops.enabled(),
                                reason="fused decode / int8-activation kernels cannot be built here")
PROMPT = [1, 504, 3458, 282, 4649, 314, 216, 11, 1202, 30, 2, 198]  # a short chat-like prefix
NEW = 12


@pytest.fixture(scope="module")
def engine():
    llm = LLM(default_model_path(), dtype="float32", enable_prefix_caching=False, max_num_seqs=2, num_threads=1)
    runner = llm.llm_engine.core.executor.driver.runner
    # OCTAVO_CPU_FUSED_DECODE unset: on by default where it gives the per-op bits
    assert isinstance(runner.graph_runner, CpuFusedDecodeRunner)
    assert cpu_fused_decode.unsupported_reason(runner.model) is None
    assert cpu_fused_decode.same_bits_reason(runner.model, torch.float32) is None
    runner.graph_runner = None  # the per-op path; each test installs what it compares
    yield llm, runner
    runner.graph_runner = None


def _greedy(llm: LLM, prompts=(PROMPT,)) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for o in outs]


class _Both:
    """Runs the fused step (2 threads), then the per-op forward of the same step (the engine's threads); records
    whether the hidden states and the K/V rows each wrote are the same bits (and the largest difference)."""

    def __init__(self, runner, dtype=torch.float32) -> None:
        self.runner, self.fused, self.diffs, self.equal = runner, CpuFusedDecodeRunner(runner.model, dtype), [], []

    def _kv(self, slot: int) -> list[torch.Tensor]:
        caches = [layer.self_attn.attn.kv_cache for layer in self.runner.model.model.layers]
        return [c.view(2, -1, c.shape[-2] * c.shape[-1])[:, slot].clone() for c in caches]

    def maybe_run(self, inputs):
        old = torch.get_num_threads()
        try:
            torch.set_num_threads(2)
            fused = self.fused.maybe_run(inputs)
        finally:
            torch.set_num_threads(old)
        if fused is None:
            return None
        slot = int(inputs.layout.slot_mapping[0])
        kv_fused = self._kv(slot)
        md = self.runner.attn_backend_cls.build_metadata(inputs.layout, self.runner.device)
        ref = self.runner.model(inputs.input_ids, inputs.positions, ForwardContext(attn_metadata=md))
        kv_ref = self._kv(slot)
        self.diffs.append(float((fused.float() - ref.float()).abs().max()))
        self.equal.append(torch.equal(fused, ref) and all(map(torch.equal, kv_fused, kv_ref)))
        return ref


def test_each_decode_step_is_bitwise_the_per_op_forward(engine):
    llm, runner = engine
    both = _Both(runner)
    runner.graph_runner = both
    try:
        _greedy(llm)
    finally:
        runner.graph_runner = None
    assert len(both.diffs) == NEW - 1  # every decode step after the prefill's token
    assert both.equal == [True] * (NEW - 1), both.diffs


def test_greedy_tokens_and_logprobs_are_the_per_op_ones(engine):
    llm, runner = engine
    (want, want_lp), = _greedy(llm)
    fused = CpuFusedDecodeRunner(runner.model, torch.float32)
    runner.graph_runner = fused
    try:
        (got, got_lp), = _greedy(llm)
        assert fused.num_runs == NEW - 1
        fused.num_runs = 0
        pair = _greedy(llm, (PROMPT, PROMPT[:-3]))  # two requests share each decode step: per-op path
        assert fused.num_runs == 0
    finally:
        runner.graph_runner = None
    assert (got, got_lp) == (want, want_lp)
    assert pair[0] == (want, want_lp)  # batched per-op steps: the same bits as the single request


class _TeamVsRegions:
    """Each decode step through fused_decode (every kernel its own OpenMP region, 1 thread) and fused_decode_team
    (one region, rows split over 2 threads): the same per-row kernel arithmetic, so the same bits."""

    def __init__(self, runner) -> None:
        self.fused, self.equal = CpuFusedDecodeRunner(runner.model, torch.float32), []

    def maybe_run(self, inputs):
        old = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            self.fused.team = False
            a = self.fused.maybe_run(inputs)
            torch.set_num_threads(2)
            self.fused.team = True
            b = self.fused.maybe_run(inputs)  # rewrites the step's K/V slot with the same bits
        finally:
            torch.set_num_threads(old)
        if a is not None:
            self.equal.append(torch.equal(a, b))
        return b


def test_team_form_is_bitwise_the_per_kernel_form(engine):
    llm, runner = engine
    probe = _TeamVsRegions(runner)
    runner.graph_runner = probe
    try:
        _greedy(llm)
    finally:
        runner.graph_runner = None
    assert probe.equal == [True] * (NEW - 1)


def test_platform_installs_it_in_front_of_another_runner(engine, monkeypatch):
    _, runner = engine
    handle = ModelHandle(model=runner.model, device=torch.device("cpu"), dtype=torch.float32, attn_backend=None,
                         block_size=runner.block_size, max_model_len=64, max_num_seqs=1, max_num_batched_tokens=64,
                         enforce_eager=False, spec_verify_shapes=())
    other = PreparedModel(step_runner=object(), notes={"compiled_decode": {}})
    monkeypatch.setenv("OCTAVO_CPU_FUSED_DECODE", "1")
    prepared = cpu_fused_decode_setup.with_fused_decode(handle, other)
    assert isinstance(prepared.step_runner, CpuFusedDecodeRunner) and prepared.step_runner.fallback is other.step_runner
    assert prepared.notes["fused_decode"] == {"batch": 1, "layers": 30} and "compiled_decode" in prepared.notes
    with pytest.raises(ConfigError, match="enforce_eager"):
        cpu_fused_decode_setup.with_fused_decode(dataclasses.replace(handle, enforce_eager=True), None)


def test_swapped_weight_data_rebuilds_the_struct(engine):
    """reload_weights swaps a parameter's .data in place: the runner must not keep the old address."""
    _, runner = engine
    fused = CpuFusedDecodeRunner(runner.model, torch.float32)
    assert not fused._stale()
    w = runner.model.model.norm.weight
    old = w.data
    w.data = old.clone()
    try:
        assert fused._stale()
        fused._build()
        assert not fused._stale() and fused._stack.final_norm == w.data_ptr()
    finally:
        w.data = old


def test_switch_values_and_refusals(monkeypatch):
    handle = ModelHandle(model=torch.nn.Linear(4, 4), device=torch.device("cpu"), dtype=torch.float32,
                         attn_backend=None, block_size=16, max_model_len=64, max_num_seqs=1,
                         max_num_batched_tokens=64, enforce_eager=False, spec_verify_shapes=())
    monkeypatch.setenv("OCTAVO_CPU_FUSED_DECODE", "yes")
    with pytest.raises(ConfigError, match="OCTAVO_CPU_FUSED_DECODE"):
        cpu_fused_decode_setup.with_fused_decode(handle, None)
    monkeypatch.setenv("OCTAVO_CPU_FUSED_DECODE", "1")
    with pytest.raises(ConfigError, match="only LlamaForCausalLM"):
        cpu_fused_decode_setup.with_fused_decode(handle, None)
    monkeypatch.setenv("OCTAVO_CPU_FUSED_DECODE", "0")
    assert cpu_fused_decode_setup.with_fused_decode(handle, None) is None
    with pytest.raises(ValueError, match="only LlamaForCausalLM"):
        CpuFusedDecodeRunner(torch.nn.Linear(4, 4), torch.float32)
