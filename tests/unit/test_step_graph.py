"""The one-graph batch-1 greedy step (plugins/platforms/cuda_step_graph.py, ``OCTAVO_GRAPH_STEP``) on the CPU: its
fill kernel writes what the torch reference writes (Triton's interpreter), and a CPU engine with the real
``StepGraph`` over a ``CUDAGraphRunner``'s static buffers and a real ``GraphHead`` (the "graph" replays its function
eagerly) gives the plain path's tokens, with its input id from the host (synchronous scheduling) or read from the
previous step's ids (async), its row staged by a copy or read from host memory and its id copied back or written
there (zero-copy), and only for the steps the core lets it take (core/step_head.py ``step_graph_source``).
The GPU capture and replay: tests/gpu/test_decode_const_inputs_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from octavo.sampling_params import SamplingParams
from tests.utils import run_triton_interpreted

_FILL = """
import torch
from octavo.plugins.platforms.cuda_step_graph import FIXED, _fill_step_kernel, fill_step_torch

W = 300
for use_prev, nb in ((0, 1), (1, 5), (1, W), (0, 257)):
    stage = torch.zeros(FIXED + W, dtype=torch.int64)
    stage[:FIXED] = torch.tensor([use_prev, 123456, 700, 701, 700, 11 * 16 + 12, nb])
    stage[FIXED:FIXED + nb] = torch.randint(1, 1 << 30, (nb,))
    prev = torch.tensor([98765, 5], dtype=torch.int64)
    outs = []
    for fill in ("kernel", "torch"):
        bufs = [torch.full((4,), -7, dtype=torch.int64), torch.full((4,), -7, dtype=torch.int64),
                torch.full((4,), -7, dtype=torch.int32), torch.full((4,), -7, dtype=torch.int32),
                torch.full((4,), -7, dtype=torch.int64), torch.full((4, W), -7, dtype=torch.int32)]
        if fill == "kernel":
            _fill_step_kernel[(1,)](stage, prev, *bufs, W, BLOCK=256)
        else:
            fill_step_torch(stage, prev, *bufs)
        outs.append(bufs)
    for a, b in zip(*outs):
        assert torch.equal(a, b), (use_prev, nb, a, b)
    ids, pos, seq, nc, slot, bt = outs[0]
    assert ids[0] == (98765 if use_prev else 123456) and pos[0] == 700 and seq[0] == 701 and slot[0] == 188
    assert torch.equal(bt[0, :nb], stage[FIXED:FIXED + nb].int()) and (bt[0, nb:] == -7).all() and (bt[1:] == -7).all()
print("ok")
"""


def test_fill_kernel_writes_what_the_reference_writes():
    run_triton_interpreted(_FILL, timeout=300)


def _argmax_out(x, out=None):
    """torch.argmax with argmax_rows's ``out=`` (the CPU stand-in that lets the raw-logits argmax run here)."""
    r = x.float().argmax(dim=-1)
    return r if out is None else out.copy_(r)


def _install(runner, zero_copy: bool, raw: bool = False):
    """A CUDAGraphRunner's static buffers (no graphs: other steps run eagerly), a GraphHead without graphs (the eager
    head), and the real StepGraph whose "capture" keeps its function (replays run it eagerly; the CPU backend derives
    its row tables when its metadata is built, so a replay builds it again from the static buffers after the fill:
    on a GPU the captured metadata reads those buffers themselves). ``zero_copy``: the SLOTS graphs reading the row
    from host row k and writing the id into host slot k."""
    from octavo.plugins.platforms.cuda_graph_head import GraphHead
    from octavo.plugins.platforms.cuda_graphs import CUDAGraphRunner
    from octavo.plugins.platforms.cuda_step_graph import StepGraph

    class EagerStepGraph(StepGraph):
        def body_head(self):
            gr.metadata[1] = runner.attn_backend_cls.build_metadata(gr._layout(1), dev)
            return super().body_head()

        def _capture_one(self, fn, pool):
            out = fn().clone()
            return SimpleNamespace(replay=lambda: out.copy_(fn())), out

    dev = runner.device
    gr = CUDAGraphRunner(runner.model, runner.attn_backend_cls, dev, runner.block_size, 128, [1])
    gr.head = GraphHead(runner.model, dev, 1)
    if raw:
        gr.head._argmax = _argmax_out
    sg = gr.step_graph = EagerStepGraph(gr, gr.head)
    sg.zc, sg.raw = zero_copy, raw
    with torch.inference_mode():
        sg.capture(None)
    assert len(sg.zc_graphs) == (4 if zero_copy else 0)
    assert (sg.raw_logits is not None) == raw
    runner.graph_runner = gr
    return sg


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    import json

    from tests.plugins.test_model_contracts import TINY

    path = tmp_path_factory.mktemp("llama")
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  **TINY, "torch_dtype": "float32"}))
    return str(path)


@pytest.mark.parametrize("async_scheduling, zero_copy, raw", [(True, False, False), (False, False, False),
                                                             (True, True, False), (False, True, False),
                                                             (True, False, True), (False, False, True)])
def test_engine_tokens_equal_with_the_step_graph(tiny_llama, async_scheduling, zero_copy, raw):
    """``raw``: the copy graph's argmax of the head's raw logits into the id buffer (OCTAVO_GRAPH_STEP_RAW_ARGMAX)."""
    from octavo import LLM

    llm = LLM(tiny_llama, load_format="dummy", dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128,
              seed=0, skip_tokenizer_init=True, async_scheduling=async_scheduling)
    try:
        sg = _install(llm.llm_engine.core.executor.driver.runner, zero_copy, raw)
        prompts = [{"prompt_token_ids": [5 + i, 9, 30, 7 + 2 * i] * (1 + 5 * i)} for i in range(3)]
        greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)  # crosses block boundaries (16)
        cases = {"greedy1": ([prompts[2]], greedy, True), "greedy2": (prompts[:2], greedy, False),
                 "seeded1": ([prompts[0]], SamplingParams(temperature=0.8, seed=4, max_tokens=12, ignore_eos=True),
                             False),
                 "logprobs1": ([prompts[1]], SamplingParams(temperature=0, logprobs=2, max_tokens=8, ignore_eos=True),
                               False)}
        for name, (ps, params, uses) in cases.items():
            got = {}
            for active in (False, True):
                sg.active, before, prev = active, sg.replays, sg.from_prev
                outs = llm.generate(ps, params, use_tqdm=False)
                got[active] = ([list(o.outputs[0].token_ids) for o in outs], [repr(o.outputs[0].logprobs) for o in outs],
                               sg.replays - before, sg.from_prev - prev)
            assert got[True][:2] == got[False][:2], name
            assert got[False][2] == 0
            if uses:  # every decode step of the request but the first (the prefill's step samples eagerly)
                assert got[True][2] >= params.max_tokens - 2, (name, got[True][2])
                # async: each step's placeholder id is read where the previous graph left it; sync: the host's id
                assert (got[True][3] >= params.max_tokens - 3) if async_scheduling else got[True][3] == 0, got[True]
            else:
                assert got[True][2] == 0, (name, got[True][2])
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("why, runner, speculator", [
    ("no one-row graph", SimpleNamespace(capture_sizes=[2, 4], model=SimpleNamespace(compute_logits=None)), False),
    ("speculative decoding", SimpleNamespace(capture_sizes=[1, 2], model=SimpleNamespace(compute_logits=None)), True),
    ("no LM head", SimpleNamespace(capture_sizes=[1, 2], model=SimpleNamespace()), False)])
def test_an_explicit_switch_is_refused_where_it_cannot_act(monkeypatch, why, runner, speculator):
    """Unset, an engine the step cannot serve runs without it; ``OCTAVO_GRAPH_STEP=1`` there fails at start, by name."""
    from octavo.plugins.platforms.cuda_step_graph import make_step_graph

    monkeypatch.delenv("OCTAVO_GRAPH_STEP", raising=False)
    assert make_step_graph(runner, None, speculator=speculator) is None
    monkeypatch.setenv("OCTAVO_GRAPH_STEP", "0")
    assert make_step_graph(runner, None, speculator=speculator) is None
    monkeypatch.setenv("OCTAVO_GRAPH_STEP", "1")
    with pytest.raises(ValueError, match=f"OCTAVO_GRAPH_STEP=1 .*\\({why}\\)"):
        make_step_graph(runner, None, speculator=speculator)
    monkeypatch.delenv("OCTAVO_GRAPH_STEP")
    monkeypatch.setenv("OCTAVO_GRAPH_STEP_ZERO_COPY", "1")  # its mode asked for: the same refusal
    with pytest.raises(ValueError, match=f"ZERO_COPY=1: .*\\({why}\\)"):
        make_step_graph(runner, None, speculator=speculator)
    monkeypatch.delenv("OCTAVO_GRAPH_STEP_ZERO_COPY")
    monkeypatch.setenv("OCTAVO_GRAPH_STEP_RAW_ARGMAX", "1")  # the other mode: the same
    with pytest.raises(ValueError, match=f"RAW_ARGMAX=1 .*\\({why}\\)"):
        make_step_graph(runner, None, speculator=speculator)


@pytest.mark.parametrize("mode", ["OCTAVO_GRAPH_STEP_ZERO_COPY", "OCTAVO_GRAPH_STEP_RAW_ARGMAX"])
def test_a_mode_without_the_step_is_refused(monkeypatch, mode):
    from octavo.plugins.platforms.cuda_step_graph import make_step_graph

    monkeypatch.setenv("OCTAVO_GRAPH_STEP", "0")
    monkeypatch.setenv(mode, "1")
    with pytest.raises(ValueError, match=f"{mode}=1 .*OCTAVO_GRAPH_STEP=0"):
        make_step_graph(SimpleNamespace(capture_sizes=[1]), None)


def test_raw_argmax_is_refused_where_the_logits_are_not_the_heads_cast(tiny_llama, monkeypatch):
    """OCTAVO_GRAPH_STEP_RAW_ARGMAX=1 where ``compute_logits`` is more than the float cast of the head's logits (a
    soft-capping model, say) or the argmax takes no ``out=``: refused at start, by name; taken where it can act. On by
    default (``RAW_ARGMAX_DEFAULT``): taken where it can act, the cast path elsewhere; ``0`` turns it off."""
    from octavo import LLM
    from octavo.plugins.platforms.cuda_graph_head import GraphHead
    from octavo.plugins.platforms.cuda_graphs import CUDAGraphRunner
    from octavo.plugins.platforms.cuda_step_graph import make_step_graph

    llm = LLM(tiny_llama, load_format="dummy", dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128,
              seed=0, skip_tokenizer_init=True)
    try:
        runner = llm.llm_engine.core.executor.driver.runner
        gr = CUDAGraphRunner(runner.model, runner.attn_backend_cls, runner.device, runner.block_size, 128, [1])
        head = GraphHead(runner.model, runner.device, 1)
        monkeypatch.setenv("OCTAVO_GRAPH_STEP_RAW_ARGMAX", "1")
        with pytest.raises(ValueError, match="RAW_ARGMAX=1: .*argmax takes no out="):  # torch.argmax: no out=
            make_step_graph(gr, head)
        head._argmax = _argmax_out
        assert make_step_graph(gr, head).raw
        plain = runner.model.compute_logits
        monkeypatch.setattr(runner.model, "compute_logits", lambda h: 30.0 * torch.tanh(plain(h) / 30.0))
        with pytest.raises(ValueError, match="RAW_ARGMAX=1: this model's compute_logits is not the float cast"):
            make_step_graph(gr, head)
        # on by default (unset): it acts where it can and steps aside elsewhere, without an error
        from octavo.plugins.platforms import cuda_step_graph

        monkeypatch.delenv("OCTAVO_GRAPH_STEP_RAW_ARGMAX")
        monkeypatch.setattr(cuda_step_graph, "RAW_ARGMAX_DEFAULT", True)
        assert not make_step_graph(gr, head).raw  # (soft-capped logits)
        monkeypatch.setattr(runner.model, "compute_logits", plain)
        assert make_step_graph(gr, head).raw
        monkeypatch.setenv("OCTAVO_GRAPH_STEP_RAW_ARGMAX", "0")
        assert not make_step_graph(gr, head).raw
    finally:
        llm.llm_engine.shutdown()
