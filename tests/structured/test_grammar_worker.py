"""The grammar worker process (plugins/structured_output/xgrammar_worker.py, OCTAVO_GRAMMAR_WORKER=1): its rows equal
the in-process backend's over random walks (host-waited fills), a device-gated fill opens the step's word only after
the rows are written, worker errors fail the fill (host: raises; device gate: the step's give-up word), and end to
end on the embedded SmolLM2 the tokens equal the in-process serial path's, synchronous and with the device gate (a
host stand-in for the device wait, as test_device_gate.py)."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from octavo.structured_outputs import StructuredOutputsParams

xgr = pytest.importorskip("xgrammar")
VOCAB = 49152
PARAMS = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}, "b": {
    "type": "string", "maxLength": 5}}, "required": ["a", "b"]}, disable_any_whitespace=True)


@pytest.fixture(scope="module")
def backends():
    from octavo.config import OctavoSettings
    from octavo.core.loader import load_tokenizer
    from octavo.plugins.structured_output.xgrammar_backend import XGrammarBackend

    inner = XGrammarBackend(load_tokenizer(OctavoSettings.from_kwargs().model), VOCAB)
    worker = inner.out_of_process(8)
    yield inner, worker
    worker.close()


def _wait_word(words, seq: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while int(words[0]) < seq:
        assert time.monotonic() < deadline, "the worker never opened the word"
        time.sleep(0.0005)


def test_worker_rows_equal_in_process_and_gate_opens_after_them(backends):
    inner, worker = backends
    compiled = inner.compile(PARAMS)
    ref = [inner.matcher(compiled) for _ in range(4)]
    rem = [worker.matcher(compiled) for _ in range(4)]
    want = torch.full((4, VOCAB // 32), -1, dtype=torch.int32)
    rng = random.Random(0)
    for step in range(12):
        live = [j for j, m in enumerate(ref) if not m.is_terminated()]
        if not live:
            break
        if step % 3 == 2:  # the device-gated form: the worker fills, then opens the word
            seq = int(worker.words[0]) + 1
            worker.post_fill([rem[j] for j in live], worker.rows[:len(live)], seq)
            _wait_word(worker.words, seq)
        else:
            worker.fill_bitmasks([rem[j] for j in live], worker.rows[:len(live)])
        inner.fill_bitmasks([ref[j] for j in live], want[:len(live)])
        assert torch.equal(worker.rows[:len(live)], want[:len(live)]), step
        tokens = []
        for k in range(len(live)):
            allowed = np.flatnonzero(np.unpackbits(want[k].numpy().view(np.uint8), bitorder="little")[:VOCAB])
            walk = [t for t in allowed.tolist() if t not in ref[live[k]]._stop] or allowed.tolist()
            tokens.append(rng.choice(walk))
        inner.accept_tokens([ref[j] for j in live], tokens)
        worker.accept_tokens([rem[j] for j in live], tokens)
    assert int(worker.words[1]) == 0


def test_wait_ready_reports_the_start_or_names_a_dead_worker(backends):
    """wait_ready (bounded): the started worker answers at once; a worker that exited is named with its code
    instead of a caller waiting out its whole bound (tests/structured/test_grammar_worker_gpu.py relies on it)."""
    from types import SimpleNamespace

    from octavo.plugins.structured_output.xgrammar_worker import XGrammarWorkerBackend

    inner, worker = backends
    assert 0 <= worker.wait_ready(60) < 60 and int(worker._buf[2]) == 1
    dead = XGrammarWorkerBackend(SimpleNamespace(tokenizer=None, vocab_size=64, info=inner.info), 2)
    try:
        dead._proc.kill()
        dead._proc.wait()
        dead._buf[2] = 0  # (as if it died before its imports ended, however fast it started)
        with pytest.raises(RuntimeError, match="exited with code"):
            dead.wait_ready(60)
    finally:
        dead.close()


def test_worker_errors_fail_the_fill(backends):
    from octavo.plugins.structured_output.xgrammar_worker import _RemoteMatcher

    _, worker = backends
    ghost = _RemoteMatcher(worker, 10**9)  # a matcher the worker never built
    with pytest.raises(RuntimeError, match="grammar worker failed a fill"):
        worker.fill_bitmasks([ghost], worker.rows[:1])
    seq = int(worker.words[0]) + 1
    worker.post_fill([ghost], worker.rows[:1], seq)
    _wait_word(worker.words, seq)  # opened (the device goes on) ...
    assert int(worker.words[1]) == seq  # ... and marked given up: the host's DeviceGate.check fails the step
    assert "fill" in worker.last_error() and "KeyError" in worker.last_error()  # ... saying why
    from octavo.core.grammar_device_gate import DeviceGate

    with pytest.raises(RuntimeError, match="grammar worker's last error: fill: KeyError"):
        DeviceGate(pin=False, words=worker.words).check(seq, worker.last_error)
    with pytest.raises(ValueError, match="shared buffer"):
        worker.fill_bitmasks([ghost], torch.full((1, VOCAB // 32), -1, dtype=torch.int32))


def test_backend_without_a_worker_is_refused(monkeypatch):
    from types import SimpleNamespace

    from octavo.core import structured_output as so_mod

    monkeypatch.setattr(so_mod, "GRAMMAR_WORKER", True)
    mgr = so_mod.StructuredOutputManager.__new__(so_mod.StructuredOutputManager)
    mgr._backend, mgr.backend_name, mgr._reasoning_name = None, "guidance", None
    mgr._backend_lock = __import__("threading").Lock()
    mgr.settings = SimpleNamespace(model=None, scheduler=SimpleNamespace(max_num_seqs=4))
    mgr.vocab_size = VOCAB

    class NoWorker:
        def __init__(self, tokenizer, vocab):
            pass

        @classmethod
        def is_available(cls):
            return True
    monkeypatch.setattr("octavo.core.loader.load_tokenizer", lambda model: object())
    monkeypatch.setattr("octavo.core.plugin_manager.get_plugin_manager",
                        lambda: SimpleNamespace(resolve=lambda kind, name: NoWorker))
    with pytest.raises(ValueError, match="OCTAVO_GRAMMAR_WORKER=1.*'guidance'"):
        mgr._get_backend()


@pytest.mark.slow
def test_worker_tokens_identical_to_in_process_serial(monkeypatch):
    jsonschema = pytest.importorskip("jsonschema")
    from octavo.core import grammar_device_gate
    from octavo.core import structured_output as so_mod
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
    runner = core.executor.driver.runner
    ex_cls = type(core.executor)
    overlapped = ex_cls.execute_structured
    kernel = _HostWait()

    def run(mode: str):
        set_async_scheduling(core, mode == "gate")
        with monkeypatch.context() as m:
            m.setattr(ex_cls, "execute_structured", Executor.execute_structured if mode != "gate" else overlapped)
            if mode == "gate":
                m.setattr(grammar_device_gate, "DEVICE_GATE", True)
                m.setattr(runner, "grammar_apply", kernel)
                m.setitem(core.structured._cpu_hint, "device_wait", True)  # (set by a GPU runner's first apply)
            return parity_rows(llm.generate(prompts, params, use_tqdm=False))

    try:
        reference = run("serial")  # in-process backend
        st = core.structured
        st._backend, st._bitmask, st._pinned, st._device_gate = None, None, False, None
        monkeypatch.setattr(so_mod, "GRAMMAR_WORKER", True)
        worker_serial = run("serial")
        assert type(st._backend).__name__ == "XGrammarWorkerBackend"
        worker_gated = run("gate")
        gave_up = int(st._device_gate.words[1])
        shared = st._device_gate.words.data_ptr() == st._backend.words.data_ptr()
    finally:
        set_async_scheduling(core, False)
        llm.llm_engine.shutdown()
    waits = [c for c in kernel.calls if c[0] == "wait"]
    assert len(waits) > 10 and gave_up == 0 and shared  # the gated path ran on the worker's words, none gave up
    assert [r[:2] for r in reference] == [w[:2] for w in worker_serial] == [g[:2] for g in worker_gated]
    assert_finished_rows_match_schema(worker_gated, params, jsonschema)
