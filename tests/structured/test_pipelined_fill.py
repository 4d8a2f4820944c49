"""The pipelined bitmask fill (core/grammar_step.py, session 5) changes when and where rows are filled, never
what: row chunks on several threads give the bytes of one call; a fill run inline when the async gate opens
gives the rows the bitmask thread gives, and its errors surface in the runner's ``wait``; the hand-off wait
returns once the runner took the rows (or at its bound). End to end on the embedded SmolLM2: async scheduling
with the inline, chunked fill gives token-identical outputs to the serial path (fill first, bytes in the batch),
and every JSON output validates (the bitmask-thread path is compared row by row above). The Triton apply runs under Triton's
interpreter in a child pytest (mask_triton_cases.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from octavo.core import async_gate, grammar_step
from octavo.core.grammar_step import GrammarStep
from tests.structured.test_grammar_step import VOCAB, mgr, schedule  # noqa: F401 - mgr is a fixture

HERE = Path(__file__).parent
PREFIXES = ['{"name": "ab', '{"na', "", '{"name": "x", "n": 1', '{\n  "name": "Zo', '{"name":"","n":-',
            '{"name": "q"', "{", '{"name": "abc", "n": 12}', '{  "name" : "a b c d e']


def test_chunked_fill_equals_one_call_and_inline_equals_thread(mgr, monkeypatch):  # noqa: F811
    monkeypatch.setattr(grammar_step, "MIN_ROWS_PER_CHUNK", 2)
    out, _ = schedule(mgr, PREFIXES)
    one = mgr.prepare(out)
    one.chunks = None
    _, _, ref = one.wait()
    ref = ref.clone()
    mgr.accept_tokens([])
    with ThreadPoolExecutor(3) as chunk_pool:
        for threads in (2, 3, 4):
            step = mgr.prepare(out)
            step.chunks = (threads, chunk_pool)
            step.start()  # on the bitmask thread, its chunks on chunk_pool
            rids, _, packed = step.wait()
            assert len(rids) == len(PREFIXES) and torch.equal(packed, ref), threads
            mgr.accept_tokens([])
            step = mgr.prepare(out)
            step.chunks = (threads, chunk_pool)
            step.start(gated=True)  # inline, as when an async gate opens
            assert step._future is None and step._rows is not None
            assert torch.equal(step.wait()[2], ref)
            mgr.accept_tokens([])
    monkeypatch.setattr(grammar_step, "INLINE_AFTER_GATE", False)
    step = mgr.prepare(out)
    step.start(gated=True)
    assert step._future is not None  # queued on the bitmask thread instead
    assert torch.equal(step.wait()[2], ref)
    mgr.accept_tokens([])


def test_cpu_apply_operands_built_by_the_fill(mgr):  # noqa: F811
    """CPU logits: the runner's first apply tells the manager the logits dtype; later fills build the apply's
    integer operands (core/grammar_mask_cpu.py) while the forward runs, and the masked logits are the same."""
    from octavo.core.grammar_step import mask_logits

    out, batch = schedule(mgr, PREFIXES[:5])
    ids = [s.request_id for s in batch.scheduled]
    logits = torch.randn(len(ids), VOCAB).to(torch.bfloat16)
    first = mgr.prepare(out)
    assert first.cpu_hint is not None and first.cpu_pre is None
    ref = mask_logits(logits.clone(), None, ids, lambda rows: rows, first)
    mgr.accept_tokens([])
    assert mgr._cpu_hint["dtype"] == torch.bfloat16 and mgr._cpu_hint["vocab"] == VOCAB
    step = mgr.prepare(out)
    step.start()
    step.wait()
    assert step.cpu_pre is not None and step.cpu_pre[1] == torch.bfloat16
    assert torch.equal(mask_logits(logits.clone(), None, ids, lambda rows: rows, step), ref)
    assert torch.isinf(ref).any() and not torch.isnan(ref).any()
    mgr.accept_tokens([])


class _Broken:
    def fill_bitmasks(self, matchers, bitmask):
        raise RuntimeError("fill failed")


def test_inline_fill_error_is_raised_by_wait():
    with ThreadPoolExecutor(1) as pool:
        step = GrammarStep(_Broken(), [0], ["a"], [object()], torch.zeros(1, 4, dtype=torch.int32), pool)
        step.start(gated=True)  # does not raise on the gate-opening thread
        with pytest.raises(RuntimeError, match="fill failed"):
            step.wait()


class _AllOnes:
    def fill_bitmasks(self, matchers, bitmask):
        bitmask[:] = 0  # every token disallowed: a row that is kept


def test_handoff_returns_when_the_runner_took_the_rows():
    with ThreadPoolExecutor(1) as pool:
        step = GrammarStep(_AllOnes(), [0], ["a"], [object()], torch.zeros(1, 4, dtype=torch.int32), pool)
        step.handoff_wait_s = 30.0
        step.start(gated=True)
        runner = threading.Timer(0.05, step.wait)
        t0 = time.perf_counter()
        runner.start()
        step.handoff()
        assert step.t_resume and time.perf_counter() - t0 < 10  # returned on the runner's take, not the bound
        runner.join()
        lone = GrammarStep(_AllOnes(), [0], ["a"], [object()], torch.zeros(1, 4, dtype=torch.int32), pool)
        lone.handoff_wait_s = 0.05
        lone.start(gated=True)
        t0 = time.perf_counter()
        lone.handoff()  # nobody takes the rows: bounded
        assert 0.04 < time.perf_counter() - t0 < 5 and not lone.t_resume


def test_triton_apply_under_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           str(HERE / "mask_triton_cases.py")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.mark.slow
def test_pipelined_fill_tokens_identical_to_serial(monkeypatch):
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    from octavo import LLM, SamplingParams
    from octavo.core.async_engine import set_async_scheduling
    from octavo.core.loader import default_model_path
    from octavo.executor import Executor
    from octavo.structured_outputs import StructuredOutputsParams

    llm = LLM(default_model_path(), dtype="float32", quantization="none", seed=0, max_model_len=384,
              max_num_seqs=8, enable_prefix_caching=False, async_scheduling=False)
    core = llm.llm_engine.core
    monkeypatch.setattr(grammar_step, "MIN_ROWS_PER_CHUNK", 2)
    core.structured.fill_threads = 3  # the chunked fill runs even on a 2-core machine
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = [SamplingParams(temperature=0.0, max_tokens=28, structured_outputs=so) for _ in range(4)]
    params.append(SamplingParams(temperature=0.8, seed=7, max_tokens=28, structured_outputs=so))
    params.append(SamplingParams(temperature=0.0, max_tokens=8))  # an unconstrained row in the same steps
    prompts = [f"Describe fruit number {i} as JSON with a name and n." for i in range(len(params))]
    ex_cls = type(core.executor)
    overlapped = ex_cls.execute_structured

    drained = []

    def step_with_drain(step=core.step, calls=iter(range(10**6))):
        if next(calls) in (4, 9):  # an rpc mid-generation: the loop completes its steps in flight first
            drained.append(len(core.async_loop.inflight))
            core.collective_rpc(lambda worker: None)
            drained.append(len(core.async_loop.stash))
        return step()

    def run(mode: str):
        set_async_scheduling(core, mode != "serial")
        with monkeypatch.context() as m:
            m.setattr(ex_cls, "execute_structured",
                      Executor.execute_structured if mode == "serial" else overlapped)  # serial: bytes first
            if mode == "old":  # session 5's loop: the runner blocks on the gate, N+2 launched at the next step()
                core.async_loop.early_launch = False
                m.setattr(async_gate, "PARK", False)
                m.setattr(async_gate, "EARLY_FILL", False)
            if mode == "earlyfill":  # N+1's fill on the bitmask thread before update(N)
                m.setattr(async_gate, "EARLY_FILL", True)
                m.setattr(async_gate, "EARLY_FILL_MIN_ROWS", 2)
            if mode == "drain":
                m.setattr(core, "step", step_with_drain)
            if mode == "switch":  # the accelerator's short GIL switch interval while structured steps are in flight
                core.async_loop.grammar_switch_s = 0.0002
                m.setattr(core, "step", lambda step=core.step: (switches.append(sys.getswitchinterval()), step())[1])
            outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].text) for o in outs]

    try:
        serial = run("serial")
        inline = run("inline")  # async: filled on the core thread as the gate opens, rows over 3 threads; the
        # runner parks its sampling on the gate and N+2 is launched between update(N) and N's outputs
        old = run("old")
        earlyfill = run("earlyfill")
        drain = run("drain")
        own = sys.getswitchinterval()
        switches: list[float] = []
        switch = run("switch")
    finally:
        set_async_scheduling(core, False)
        llm.llm_engine.shutdown()
    assert inline == serial
    assert old == serial
    assert earlyfill == serial
    assert drain == serial
    assert switch == serial
    assert min(switches) < 0.0003 and sys.getswitchinterval() == own  # short while in flight, put back after
    assert drained[0] == 2 and drained[1] >= 1  # two steps were in flight, their outputs came from the stash
    assert core.structured.stats["steps"] > 0
    for _tokens, reason, text in serial[:5]:
        if reason == "stop":
            jsonschema.validate(json.loads(text), SCHEMA)
    assert sum(r == "stop" for _, r, _ in serial[:5]) >= 3  # most rows finish their JSON in 28 tokens
