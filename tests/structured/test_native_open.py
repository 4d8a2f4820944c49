"""The native fill + open (``OCTAVO_GRAMMAR_NATIVE_OPEN``, core/grammar_device_gate.py ``NATIVE_OPEN``,
plugins/structured_output/xgrammar_native.py): xgrammar's batch fill called from C, which then opens the device gate's
word. Real SmolLM2 tokenizer, real xgrammar: the same bytes as the Python fill (one thread and xgrammar's own pool),
the word opened to the step's number only after a fill that succeeded and never lowered, the Python path where a row
is terminated or the native call fails (the library's own error raised, the word then opened by Python so the device
never spins to its time-out), the switch honored or refused by name, and greedy tokens of a device-gated engine
(host stand-in for the device's wait) identical to the serial path's, filled at the accept (async_gate
NATIVE_OPEN_INLINE, 1 and 4 chunks) or on the bitmask thread."""

from __future__ import annotations

import pytest
import torch

import octavo.plugins.structured_output.xgrammar_backend as xgb
import octavo.plugins.structured_output.xgrammar_native as xn
from octavo.core import async_gate, grammar_device_gate
from octavo.core.async_gate import GatedGrammarStep
from octavo.core.grammar_device_gate import DeviceGate
from tests.structured.test_grammar_step import mgr, schedule  # noqa: F401 - mgr is a fixture
from tests.structured.test_pipelined_fill import PREFIXES

pytest.importorskip("xgrammar")


def _reference(mgr, out):  # noqa: F811
    step = mgr.prepare(out)
    step.chunks = None
    ref = step.wait()[2].clone()
    mgr.accept_tokens([])
    return ref, step.matchers


@pytest.mark.parametrize("threads,pool", [(1, 1), (4, 1), (1, 4), (1, 3), (1, 8)])
def test_native_fill_fills_the_same_bytes_and_opens_the_word(mgr, monkeypatch, threads, pool):  # noqa: F811
    """``threads``: xgrammar's own pool; ``pool``: the shim's chunks (3: uneven; 8: fewer rows than 8 x 4, so 4)."""
    out, _ = schedule(mgr, [p for p in PREFIXES * 2 if p is not None])
    ref, _ = _reference(mgr, out)
    assert (ref != -1).any(), "the prefixes constrain something"
    monkeypatch.setattr(xgb, "NATIVE_FILL_THREADS", threads)
    monkeypatch.setattr(xn, "POOL_THREADS", pool)
    backend = mgr._get_backend()
    step = mgr.prepare(out)
    words = DeviceGate(pin=False).words
    step.bitmask.fill_(0)  # stale bytes must not survive
    t_end = backend.fill_open(step.matchers, step.bitmask, words, 5)
    assert t_end > 0 and torch.equal(step.bitmask, ref) and words.tolist() == [5, 0]
    step.bitmask.fill_(0)
    assert backend.fill_open(step.matchers, step.bitmask, words, 3) > 0  # an older step: filled, word kept at 5
    assert torch.equal(step.bitmask, ref) and words.tolist() == [5, 0]
    native = backend._local.native
    assert native.batch is backend._local.batch  # the thread's own BatchGrammarMatcher (threads)
    assert native.n == min(pool, len(step.matchers) // xn.MIN_ROWS_PER_CHUNK) and bool(native.pool) == (pool > 1)
    mgr.accept_tokens([])


def test_a_terminated_row_goes_through_python_and_python_opens(mgr):  # noqa: F811
    out, _ = schedule(mgr, ['{"name": "a", "n": 1}', '{"na', '{"name": "b'])
    step = mgr.prepare(out)
    m = step.matchers[0]
    assert m.accept_token(mgr.tok.convert_tokens_to_ids("<|im_end|>")) and m.is_terminated()
    words = DeviceGate(pin=False).words
    assert mgr._get_backend().fill_open(step.matchers, step.bitmask, words, 1) == 0.0  # not opened from C
    assert words.tolist() == [0, 0] and step.bitmask[0].eq(-1).all() and not step.bitmask[1].eq(-1).all()
    mgr.accept_tokens([])


def test_failed_native_call_raises_xgrammars_error_and_the_step_still_opens(mgr, monkeypatch):  # noqa: F811
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)
    monkeypatch.setattr(grammar_device_gate, "NATIVE_OPEN", True)
    out, _ = schedule(mgr, PREFIXES[:async_gate.EARLY_FILL_MIN_ROWS + 1])
    step = mgr.prepare(out)
    backend = mgr._get_backend()
    bad = torch.zeros(len(step.matchers), step.bitmask.shape[1] - 1, dtype=torch.int32)  # a row too short
    words = DeviceGate(pin=False).words
    with pytest.raises(Exception, match="(?i)shape|bitmask"):
        backend.fill_open(step.matchers, bad, words, 1)
    assert words.tolist() == [0, 0]  # C did not open it
    # through the gate: the same error reaches the host, and the word is opened (by Python) all the same
    step.device_gate = DeviceGate(pin=False)
    step.bitmask = bad
    gate = GatedGrammarStep(step, out)
    gate.start_fill()
    with pytest.raises(Exception, match="(?i)shape|bitmask"):
        gate.inner.wait()
    assert step.device_gate.words[0] == gate.seq == 1
    mgr._inflight = None


@pytest.mark.parametrize("inline", [True, False])
def test_the_gate_opens_from_c_and_stats_the_lag(mgr, monkeypatch, inline):  # noqa: F811
    """``inline`` (async_gate.NATIVE_OPEN_INLINE): the fill runs at the accept on the calling thread, the word open
    when start_fill returns; else on the bitmask thread."""
    import threading

    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)
    monkeypatch.setattr(grammar_device_gate, "NATIVE_OPEN", True)
    monkeypatch.setattr(async_gate, "NATIVE_OPEN_INLINE", inline)
    out, _ = schedule(mgr, [p for p in PREFIXES if p is not None])
    ref, _ = _reference(mgr, out)
    step = mgr.prepare(out)
    step.device_gate = DeviceGate(pin=False)
    step.bitmask.fill_(0)
    calls, threads = [], []
    backend = mgr._get_backend()
    monkeypatch.setattr(backend, "fill_bitmasks", lambda *a: calls.append(a))  # the Python fill must not run
    fill_open = backend.fill_open
    monkeypatch.setattr(backend, "fill_open", lambda *a: threads.append(threading.current_thread()) or fill_open(*a))
    gate = GatedGrammarStep(step, out)
    gate.start_fill()
    assert gate.is_released() == inline and (not inline or step.device_gate.words[0] == gate.seq)
    gate.inner.wait()
    assert not calls and torch.equal(step.bitmask, ref) and step.device_gate.words[0] == gate.seq
    assert (threads == [threading.current_thread()]) == inline and len(threads) == 1
    assert step.open_lag_s >= 0 and 0 < step.fill_s and step.t_fill1 >= step.t_fill0
    monkeypatch.undo()
    mgr.accept_tokens([])


def test_switch_is_honored_or_refused_by_name():
    import os
    import subprocess
    import sys

    code = "from octavo.core import grammar_device_gate as g; print(g.NATIVE_OPEN)"
    for value, want in (("1", "True"), ("0", "False"), ("", "True")):  # on by default since the end of session 14
        env = {**os.environ, "OCTAVO_GRAMMAR_NATIVE_OPEN": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr[-500:]
    env = {**os.environ, "OCTAVO_GRAMMAR_NATIVE_OPEN": "yes"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "OCTAVO_GRAMMAR_NATIVE_OPEN='yes'" in out.stderr

    class NoNative:
        pass

    with pytest.raises(ValueError, match="OCTAVO_GRAMMAR_NATIVE_OPEN=1.*'guidance'"):
        grammar_device_gate.check_native_open(NoNative(), "guidance")

    class Broken:
        def check_fill_open(self):
            raise RuntimeError("no compiler")

    with pytest.raises(ValueError, match="OCTAVO_GRAMMAR_NATIVE_OPEN=1.*no compiler"):
        grammar_device_gate.check_native_open(Broken(), "xgrammar")
    xgb.XGrammarBackend.check_fill_open()  # builds and fills a tiny grammar here (the CI machine has a C compiler)


def test_the_engine_refuses_the_switch_where_the_shim_cannot_run(monkeypatch):
    from octavo.config import OctavoSettings
    from octavo.core.structured_output import StructuredOutputManager

    monkeypatch.setattr(grammar_device_gate, "NATIVE_OPEN", True)
    monkeypatch.setattr(grammar_device_gate, "NATIVE_OPEN_EXPLICIT", True)  # (OCTAVO_GRAMMAR_NATIVE_OPEN=1 set)

    def broken():
        raise RuntimeError("the fill shim did not build: no C compiler")

    monkeypatch.setattr(xgb.XGrammarBackend, "check_fill_open", staticmethod(broken))
    m = StructuredOutputManager(OctavoSettings.from_kwargs(), 49152, [2])
    with pytest.raises(ValueError, match="OCTAVO_GRAMMAR_NATIVE_OPEN=1.*no C compiler"):
        m._get_backend()
    m.shutdown()


def test_the_default_falls_back_to_the_python_fill_where_the_shim_cannot_run(monkeypatch, caplog):
    """The default (switch not set): the engine starts; when its device gate is first made the native fill is
    checked, and where it cannot run a warning says why and the steps take the Python fill on the bitmask thread."""
    import logging

    from octavo.config import OctavoSettings
    from octavo.core.structured_output import StructuredOutputManager

    monkeypatch.setattr(grammar_device_gate, "NATIVE_OPEN", True)
    monkeypatch.setattr(grammar_device_gate, "NATIVE_OPEN_EXPLICIT", False)
    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)

    def broken():
        raise RuntimeError("the fill shim did not build: no C compiler")

    monkeypatch.setattr(xgb.XGrammarBackend, "check_fill_open", staticmethod(broken))
    settings = OctavoSettings.from_kwargs()
    m = StructuredOutputManager(settings, 49152, [2])
    from octavo.core.loader import load_tokenizer

    m.tok = load_tokenizer(settings.model)
    backend = m._get_backend()  # no refusal: the default
    out, _ = schedule(m, PREFIXES[:async_gate.EARLY_FILL_MIN_ROWS + 1])
    m._cpu_hint["device_wait"] = True  # (set by a GPU runner's first apply)
    with caplog.at_level(logging.WARNING):
        step = m.prepare(out)
    assert "native fill cannot run here (the fill shim did not build: no C compiler); using the Python fill" in \
        caplog.text and backend.fill_open is None
    gate = GatedGrammarStep(step, out)
    gate.start_fill()  # not inline: the Python fill on the bitmask thread
    assert not gate.is_released()
    gate.inner.wait()
    assert step.device_gate.words[0] == gate.seq and step.open_lag_s == 0
    m.shutdown()


def test_native_open_tokens_identical_to_serial(monkeypatch):
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

    def run(mode: str):
        set_async_scheduling(core, mode != "serial")
        with monkeypatch.context() as m:
            m.setattr(ex_cls, "execute_structured", Executor.execute_structured if mode == "serial" else overlapped)
            if mode.startswith("native"):
                m.setattr(grammar_device_gate, "DEVICE_GATE", True)
                m.setattr(grammar_device_gate, "NATIVE_OPEN", True)
                m.setattr(async_gate, "EARLY_FILL_MIN_ROWS", 2)  # (the bitmask thread's fill from 2 rows)
                m.setattr(xn, "POOL_THREADS", 1 if mode == "native" else 4)
                m.setattr(async_gate, "NATIVE_OPEN_INLINE", mode != "native_p4_thread")  # (else the bitmask thread)
                m.setattr(xn, "MIN_ROWS_PER_CHUNK", 1)  # (the parity batch is small: every row its own chunk)
                m.setattr(core.executor.driver.runner, "grammar_apply", kernel)
                m.setitem(core.structured._cpu_hint, "device_wait", True)  # (set by a GPU runner's first apply)
            return parity_rows(llm.generate(prompts, params, use_tqdm=False))

    try:
        serial = run("serial")
        lag0 = core.structured.stats["open_lag_s"]
        native = run("native")
        lag1 = core.structured.stats["open_lag_s"]
        pooled = run("native_p4")
        lag2 = core.structured.stats["open_lag_s"]
        threaded = run("native_p4_thread")
    finally:
        set_async_scheduling(core, False)
        llm.llm_engine.shutdown()
    waits = [c for c in kernel.calls if c[0] == "wait"]
    assert len(waits) > 10 and core.structured._device_gate.words[1] == 0  # the device path ran, never gave up
    assert core.structured.stats["open_lag_s"] > lag2 > lag1 > lag0  # words opened from C, in every run
    assert [s[:2] for s in serial] == [g[:2] for g in native] == [p[:2] for p in pooled] == [t[:2] for t in threaded]
    assert_finished_rows_match_schema(serial, params, jsonschema)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pool", [1, 4])
def test_the_device_waits_for_the_word_the_shim_opens(pool, monkeypatch):
    """On the GPU: the wait + apply (graph) is queued before the fill; the device stays busy until the shim's C store
    opens the word; the masked logits equal the host path on the rows xgrammar's Python fill gives. A synthetic
    4,096-token vocabulary (no tokenizer file needed on the device host)."""
    pytest.importorskip("triton")
    import time
    from types import SimpleNamespace

    import xgrammar as xgr

    from octavo.core.grammar_device_gate import apply_gated
    from octavo.core.grammar_step import GrammarStep, apply_packed
    from octavo.plugins.platforms.cuda import CudaPlatform
    from octavo.plugins.platforms.cuda_grammar_mask import wait_host_flag

    monkeypatch.setattr(grammar_device_gate, "DEVICE_GATE", True)
    vocab, n = 4096, 8
    info = xgr.TokenizerInfo([chr(97 + i % 26) * (1 + i // 26) for i in range(vocab)], vocab_size=vocab,
                             stop_token_ids=[25])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_regex("(a|bb)+c?")
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(n)]
    for m, toks in zip(matchers, [[], [0], [27], [0, 2], [26], [0, 27, 0], [27, 2], [0]]):
        for t in toks:
            assert m.accept_token(t)
    batch = xgr.BatchGrammarMatcher(max_threads=1)
    ref = torch.zeros(n, vocab // 32, dtype=torch.int32)
    batch.batch_fill_next_token_bitmask(matchers, ref)
    native = xn.NativeFill(batch, pool)
    kernel = CudaPlatform().make_grammar_mask_apply()
    monkeypatch.setattr(kernel.gated_graphs, "CAPTURE_AFTER", 1)
    dg = DeviceGate()
    buf = torch.zeros(n, vocab // 32, dtype=torch.int32, pin_memory=True)
    wait_host_flag(dg.words, 0)  # (every kernel loaded before a wait is queued: test_apply_device.py says why)
    torch.cuda.synchronize()
    rids = [f"r{j}" for j in range(n)]
    for step_no in range(3):  # (the graph is captured on the 2nd)
        inner = GrammarStep(None, list(range(n)), rids, [None] * n, buf, None)
        inner.device_gate, inner.seq = dg, dg.next_seq()
        logits = torch.randn(n, vocab)
        dev = apply_gated(logits.to("cuda"), SimpleNamespace(inner=inner, seq=inner.seq, apply_s=0.0), rids,
                          lambda rows: rows, kernel)
        time.sleep(0.05)
        assert not torch.cuda.current_stream().query()  # the device waits for the word
        buf.fill_(0)
        assert native(matchers, buf, dg.words, inner.seq) > 0 and dg.words[0] == inner.seq
        torch.cuda.synchronize()
        dg.check(inner.seq)
        assert torch.equal(dev.cpu(), apply_packed(logits.clone(), list(range(n)), ref)), step_no
    assert not grammar_device_gate._GRAPH_FAILED
