"""Session 15's native fill not waited for (``OCTAVO_GRAMMAR_NATIVE_START``) and N's accept inside the native call
(``OCTAVO_GRAMMAR_NATIVE_ACCEPT``): core/grammar_device_gate.py, core/grammar_accept.py,
plugins/structured_output/xgrammar_native.py. Real SmolLM2 tokenizer, real xgrammar: the rows and the matchers' states
equal the Python accept + xgrammar's Python fill (1, 3 and 4 chunks; waited for and started); a refused token warns as
the Python accept does; a stop token among the tokens or a terminated row makes the accept run in Python; the word
opens only after the rows; a failed started call is filled again in Python (xgrammar's error raised) and the word
opened by the host; and greedy tokens of a device-gated engine (host stand-in for the device's wait) equal the serial
path's in every combination."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import torch

import octavo.plugins.structured_output.xgrammar_native as xn
from octavo.core import async_gate, grammar_chain, grammar_device_gate
from octavo.core.async_gate import GatedGrammarStep
from octavo.core.grammar_accept import RowsAccept
from octavo.core.grammar_device_gate import DeviceGate
from tests.structured.test_grammar_step import mgr, schedule  # noqa: F401 - mgr is a fixture
from tests.structured.test_pipelined_fill import PREFIXES

pytest.importorskip("xgrammar")
LIVE = [p for p in PREFIXES if p is not None] * 2  # 20 rows: 4 chunks of 5 (MIN_ROWS_PER_CHUNK 4)
COMPLETE = '{"name": "abc", "n": 12}'  # (only the stop token allowed next)
OPEN = [p for p in LIVE if p != COMPLETE]


def _allowed(row: torch.Tensor, skip: set[int], nth: int = 0) -> int:
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")
    ok = [t for t in np.flatnonzero(bits).tolist() if t not in skip]
    return ok[min(nth, len(ok) - 1)]


def _python_reference(mgr, tokens_of):  # noqa: F811
    """(rows after the Python accept + fill, the tokens, the tokens' accept results) on fresh requests."""
    out, _ = schedule(mgr, OPEN)
    step = mgr.prepare(out)
    step.chunks = None
    before = step.wait()[2].clone()
    mgr.accept_tokens([])
    tokens = tokens_of(before, step.matchers)
    backend = mgr._get_backend()
    ok = backend.accept_tokens(step.matchers, tokens)
    backend.fill_bitmasks(step.matchers, step.bitmask)
    return step.bitmask.clone(), tokens, ok


def _tokens(stop: set[int], refuse: int | None = None):
    def pick(before, matchers):
        toks = [_allowed(before[j], stop, j % 3) for j in range(len(matchers))]
        if refuse is not None:  # a token row ``refuse`` does not allow (the Python accept refuses it: a warning)
            bits = np.unpackbits(before[refuse].numpy().view(np.uint8), bitorder="little")
            toks[refuse] = int(np.flatnonzero(bits == 0)[0])
        return toks
    return pick


@pytest.mark.parametrize("pool,spin", [(1, 0.0), (3, 0.0), (4, 0.0), (4, 2000.0)])
@pytest.mark.parametrize("started", [False, True])
def test_accept_in_c_then_fill_equals_python(mgr, monkeypatch, caplog, pool, spin, started):  # noqa: F811
    """``spin``: the idle workers poll for the next call (xgrammar_native.SPIN_US) instead of sleeping at once."""
    monkeypatch.setattr(xn, "POOL_THREADS", pool)
    monkeypatch.setattr(xn, "SPIN_US", spin)
    backend = mgr._get_backend()
    stop = set(mgr.tok.all_special_ids)
    ref, tokens, ok = _python_reference(mgr, _tokens(stop, refuse=1))
    assert ok.count(False) == 1 and not ok[1]
    out, _ = schedule(mgr, OPEN)  # the same states again, on new requests
    step = mgr.prepare(out)
    words = DeviceGate(pin=False).words
    step.bitmask.fill_(0)
    acc = RowsAccept(mgr, step.matchers, tokens, step.request_ids)
    with caplog.at_level(logging.WARNING):
        if started:
            job = backend.fill_open_start(step.matchers, step.bitmask, words, 7, acc)
            assert job is not None and acc.done
            assert job.join() > 0 and job.join() > 0  # (twice: the same answer)
        else:
            assert backend.fill_open(step.matchers, step.bitmask, words, 7, acc) > 0 and acc.done
    assert torch.equal(step.bitmask, ref) and words.tolist() == [7, 0]
    assert f"request {step.request_ids[1]}: token {tokens[1]} breaks its grammar" in caplog.text
    # the matchers moved exactly as the Python accept moved them: the next fill (Python) is the same again
    step.bitmask.fill_(0)
    backend.fill_bitmasks(step.matchers, step.bitmask)
    assert torch.equal(step.bitmask, ref)
    mgr.accept_tokens([])


def test_a_stop_token_or_a_terminated_row_accepts_in_python(mgr, monkeypatch):  # noqa: F811
    monkeypatch.setattr(xn, "POOL_THREADS", 4)
    backend = mgr._get_backend()
    eos = mgr.tok.convert_tokens_to_ids("<|im_end|>")
    out, _ = schedule(mgr, LIVE)
    step = mgr.prepare(out)
    step.chunks = None
    before = step.wait()[2].clone()
    mgr.accept_tokens([])
    done = [j for j, p in enumerate(LIVE) if p == COMPLETE]
    tokens = [eos if j in done else _allowed(before[j], {eos}) for j in range(len(LIVE))]
    calls = []
    acc = RowsAccept(mgr, step.matchers, tokens, step.request_ids)
    monkeypatch.setattr(mgr, "_accept", lambda *a: calls.append(a) or type(mgr)._accept(mgr, *a))
    words = DeviceGate(pin=False).words
    assert backend.fill_open_start(step.matchers, step.bitmask, words, 1, acc) is None  # not started: C can't
    assert len(calls) == 1 and acc.done and all(step.matchers[j].is_terminated() for j in done)
    assert backend.fill_open(step.matchers, step.bitmask, words, 1, acc) == 0.0  # terminated rows: Python fills
    assert all(step.bitmask[j].eq(-1).all() for j in done) and words.tolist() == [0, 0]
    mgr.accept_tokens([])


def test_a_failed_started_call_raises_xgrammars_error_and_the_host_opens(mgr, monkeypatch):  # noqa: F811
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)
    monkeypatch.setattr(grammar_device_gate, "NATIVE_OPEN", True)
    monkeypatch.setattr(grammar_device_gate, "NATIVE_START", True)
    monkeypatch.setattr(xn, "POOL_THREADS", 2)
    out, _ = schedule(mgr, LIVE)
    step = mgr.prepare(out)
    bad = torch.zeros(len(step.matchers), step.bitmask.shape[1] - 1, dtype=torch.int32)  # a row too short
    step.device_gate = DeviceGate(pin=False)
    step.bitmask = bad
    gate = GatedGrammarStep(step, out)
    gate.start_fill()  # at the accept: started in C, not waited for
    assert gate.is_released() and step._job is not None
    step.settle()  # (what the loop does before it waits for the step's tokens)
    assert step.device_gate.words[0] == gate.seq == 1  # opened by the host after the Python fill failed
    with pytest.raises(Exception, match="(?i)shape|bitmask"):
        gate.inner.wait()
    mgr._inflight = None
    mgr._get_backend().settle()


@pytest.mark.parametrize("mode", ["start", "accept", "start_accept", "start_accept_spin"])
def test_tokens_identical_to_serial(monkeypatch, mode):
    jsonschema = pytest.importorskip("jsonschema")
    from octavo.core.async_engine import set_async_scheduling
    from octavo.executor import Executor
    from tests.structured.test_device_gate import (
        _HostWait,
        assert_finished_rows_match_schema,
        parity_engine,
        parity_rows,
    )

    llm, params, prompts = parity_engine()
    core = llm.llm_engine.core
    ex_cls = type(core.executor)
    overlapped = ex_cls.execute_structured
    kernel = _HostWait()
    taken, started = [], []

    def run(mode: str, pool: int = 1):
        set_async_scheduling(core, mode != "serial")
        with monkeypatch.context() as m:
            m.setattr(ex_cls, "execute_structured", Executor.execute_structured if mode == "serial" else overlapped)
            if mode != "serial":
                m.setattr(grammar_device_gate, "DEVICE_GATE", True)
                m.setattr(grammar_device_gate, "NATIVE_OPEN", True)
                m.setattr(grammar_device_gate, "NATIVE_START", "start" in mode)
                m.setattr(grammar_device_gate, "NATIVE_ACCEPT", "accept" in mode)
                m.setattr(grammar_chain, "CHAIN", False)  # (the chained fill would take the accept's steps)
                m.setattr(xn, "POOL_THREADS", pool)
                m.setattr(xn, "SPIN_US", 200.0 if "spin" in mode else 0.0)
                m.setattr(xn, "MIN_ROWS_PER_CHUNK", 1)  # (the parity batch is small: every row its own chunk)
                m.setattr(core.executor.driver.runner, "grammar_apply", kernel)
                m.setitem(core.structured._cpu_hint, "device_wait", True)  # (set by a GPU runner's first apply)
                native, start = RowsAccept.native, xn.NativeFill.start
                m.setattr(RowsAccept, "native", lambda self, ok: taken.append(len(ok)) or native(self, ok))
                m.setattr(xn.NativeFill, "start", lambda self, *a: started.append(start(self, *a)) or started[-1])
            return parity_rows(llm.generate(prompts, params, use_tqdm=False))

    try:
        serial = run("serial")
        one = run(mode, 1)
        four = run(mode, 4)
    finally:
        set_async_scheduling(core, False)
        llm.llm_engine.shutdown()
    assert core.structured._device_gate.words[1] == 0  # the device path ran, never gave up
    assert [s[:2] for s in serial] == [g[:2] for g in one] == [p[:2] for p in four]
    assert ("accept" in mode) == (len(taken) > 4)  # N's accept ran in C on the steady steps
    assert ("start" in mode) == (started.count(True) > 4)  # the fills were started in C, not waited for
    assert_finished_rows_match_schema(serial, params, jsonschema)
    assert async_gate.NATIVE_OPEN_INLINE


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pool", [1, 4])
def test_the_device_waits_for_the_started_fill(pool, monkeypatch):
    """On the GPU: the wait + apply (graph) is queued; the started fill (N's accept in C, then the rows) returns at
    once, the device waits until the shim's last chunk opens the word, and the masked logits equal the host path on
    the rows of xgrammar's Python accept + fill. A synthetic 4,096-token vocabulary (no tokenizer file needed)."""
    pytest.importorskip("triton")
    from types import SimpleNamespace

    import xgrammar as xgr

    from octavo.core.grammar_device_gate import apply_gated
    from octavo.core.grammar_step import GrammarStep, apply_packed
    from octavo.plugins.platforms.cuda import CudaPlatform
    from octavo.plugins.platforms.cuda_grammar_mask import wait_host_flag

    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)
    monkeypatch.setattr(xn, "MIN_ROWS_PER_CHUNK", 2)
    vocab, n = 4096, 8
    info = xgr.TokenizerInfo([chr(97 + i % 26) * (1 + i // 26) for i in range(vocab)], vocab_size=vocab,
                             stop_token_ids=[25])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_regex("(a|bb)+c?")
    mine, ref_m = ([xgr.GrammarMatcher(compiled) for _ in range(n)] for _ in range(2))
    for ms in (mine, ref_m):
        for m, toks in zip(ms, [[], [0], [27], [0, 2], [26], [0, 27, 0], [27, 2], [0]]):
            for t in toks:
                assert m.accept_token(t)
    batch = xgr.BatchGrammarMatcher(max_threads=1)
    native = xn.NativeFill(batch, pool, started=True)
    kernel = CudaPlatform().make_grammar_mask_apply()
    monkeypatch.setattr(kernel.gated_graphs, "CAPTURE_AFTER", 1)
    dg = DeviceGate()
    buf = torch.zeros(n, vocab // 32, dtype=torch.int32, pin_memory=True)
    wait_host_flag(dg.words, 0)  # (every kernel loaded before a wait is queued: test_apply_device.py says why)
    torch.cuda.synchronize()
    rids = [f"r{j}" for j in range(n)]
    for step_no, tok in enumerate((0, 27, 0)):  # (the graph is captured on the 2nd)
        ok_ref = [m.accept_token(tok) for m in ref_m]
        ref = torch.zeros(n, vocab // 32, dtype=torch.int32)
        xgr.BatchGrammarMatcher(max_threads=1).batch_fill_next_token_bitmask(ref_m, ref)
        inner = GrammarStep(None, list(range(n)), rids, [None] * n, buf, None)
        inner.device_gate, inner.seq = dg, dg.next_seq()
        logits = torch.randn(n, vocab)
        dev = apply_gated(logits.to("cuda"), SimpleNamespace(inner=inner, seq=inner.seq, apply_s=0.0), rids,
                          lambda rows: rows, kernel)
        time.sleep(0.05)
        assert not torch.cuda.current_stream().query()  # the device waits for the word
        buf.fill_(0)
        assert native.start(mine, buf, dg.words, inner.seq, [tok] * n)
        assert native.join() > 0 and dg.words[0] == inner.seq
        assert list(native.accepted(n)) == [int(o) for o in ok_ref], step_no
        torch.cuda.synchronize()
        dg.check(inner.seq)
        assert torch.equal(buf, ref) and torch.equal(dev.cpu(), apply_packed(logits.clone(), list(range(n)), ref))
    assert not grammar_device_gate._GRAPH_FAILED


def test_the_switches_are_honored_or_refused_by_name(monkeypatch):
    import os
    import subprocess
    import sys

    import octavo.plugins.structured_output.xgrammar_backend as xgb

    code = "from octavo.core import grammar_device_gate as g; print(g.NATIVE_START, g.NATIVE_ACCEPT)"
    for env, want in (({}, "False False"), ({"OCTAVO_GRAMMAR_NATIVE_START": "1"}, "True False"),
                      ({"OCTAVO_GRAMMAR_NATIVE_ACCEPT": "1", "OCTAVO_GRAMMAR_NATIVE_START": "0"}, "False True")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=120)
        assert out.stdout.strip() == want, out.stderr[-500:]
    for env, msg in (({"OCTAVO_GRAMMAR_NATIVE_ACCEPT": "yes"}, "OCTAVO_GRAMMAR_NATIVE_ACCEPT='yes'"),
                     ({"OCTAVO_GRAMMAR_NATIVE_START": "1", "OCTAVO_GRAMMAR_NATIVE_OPEN": "0"},
                      "OCTAVO_GRAMMAR_NATIVE_START / OCTAVO_GRAMMAR_NATIVE_ACCEPT=1 work on the native fill")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode != 0 and msg in out.stderr, out.stderr[-500:]

    def broken():  # where the shim cannot run, set explicitly: refused (the default would fall back with a warning)
        raise RuntimeError("the fill shim did not build: no C compiler")

    monkeypatch.setattr(grammar_device_gate, "NATIVE_START_ACCEPT_EXPLICIT", True)
    backend = type("Backend", (), {"check_fill_open": staticmethod(broken), "fill_open": xgb.XGrammarBackend.fill_open})()
    with pytest.raises(ValueError, match="OCTAVO_GRAMMAR_NATIVE_START / OCTAVO_GRAMMAR_NATIVE_ACCEPT=1.*no C compiler"):
        grammar_device_gate.native_open_or_fallback(backend, "xgrammar")


def test_the_direct_graph_launch_switch_is_honored_or_refused_by_name():
    """OCTAVO_GRAMMAR_GRAPH_DIRECT (plugins/platforms/cuda_grammar_mask.py DIRECT_LAUNCH): 0/1 only, off by default;
    where the driver library is missing the graph goes through torch with a warning (the GPU test runs the launch)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    code = "from octavo.plugins.platforms import cuda_grammar_mask as m; print(m.DIRECT_LAUNCH)"
    for value, want in (("", "False"), ("1", "True"), ("0", "False")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OCTAVO_GRAMMAR_GRAPH_DIRECT": value},
                             capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr[-500:]
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OCTAVO_GRAMMAR_GRAPH_DIRECT": "on"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "OCTAVO_GRAMMAR_GRAPH_DIRECT='on'" in out.stderr
