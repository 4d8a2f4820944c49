"""The grammar worker process on a GPU (plugins/structured_output/xgrammar_worker.py, OCTAVO_GRAMMAR_WORKER=1): its
shared block registers with CUDA (pinned rows and gate words), and the device gate's real wait + apply, queued
before the worker fills, read the rows the worker wrote: the masked logits equal the host apply of those rows.
A tiny byte-level vocabulary (no tokenizer files needed on the device). Skipped without CUDA.

Every wait is bounded and names what it waited for (session 11's suite cut this test at its 200 s cap and could not
tell a hang from a slow start): the worker's start (imports, ``wait_ready``), then each step's device work (polled
on an event, not ``synchronize``). A device wait still spinning at its bound is opened by the test itself, so the
device is free again for the tests after it, and the failure says whether the worker ever opened the word."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
xgr = pytest.importorskip("xgrammar")

# the worker's start: a fresh interpreter importing torch and xgrammar (seconds on a loaded host); a device script
# with a tighter budget may lower it (benchmarks/device/structured9.sh s12)
START_S = float(os.environ.get("OCTAVO_TEST_WORKER_START_S", "90"))
STEP_S = 10.0  # one step's wait + apply once the worker runs (milliseconds when it works)


def _finish_or_fail(worker, seq: int, what: str) -> None:
    """Wait up to STEP_S for the device work queued so far; else open the word from here (the device goes on) and
    fail with the gate's state and whether the worker process is alive."""
    done = torch.cuda.Event()
    done.record()
    t0 = time.perf_counter()
    while not done.query():
        if time.perf_counter() - t0 > STEP_S:
            opened, gave_up = (int(x) for x in worker.words.tolist())
            alive = worker._proc.poll() is None  # noqa: SLF001
            worker.words[0] = max(opened, seq)  # release the device's wait (its result is not used)
            done.synchronize()
            pytest.fail(f"{what}: the device still waited for step {seq} after {STEP_S:.0f} s: words[0] = {opened} "
                        f"(the worker {'never opened it' if opened < seq else 'opened it'}), words[1] = {gave_up}, "
                        f"worker process {'alive' if alive else 'exited'}, its last error: {worker.last_error()!r}")
        time.sleep(0.001)


def test_worker_rows_feed_the_device_gate():
    pytest.importorskip("triton")
    from octavo.core.grammar_device_gate import DeviceGate, apply_gated
    from octavo.core.grammar_step import GrammarStep, apply_packed
    from octavo.plugins.platforms.cuda import CudaPlatform
    from octavo.plugins.structured_output.xgrammar_worker import XGrammarWorkerBackend

    vocab = 320  # 256 bytes + specials + padding: 10 words per row
    encoded = [bytes([i]) for i in range(256)] + [b"<eos>"] + [b"<pad%d>" % i for i in range(63)]
    info = xgr.TokenizerInfo(encoded, vocab_size=vocab, stop_token_ids=[256])
    inner = SimpleNamespace(tokenizer=None, vocab_size=vocab, info=info,
                            compile=lambda p: xgr.GrammarCompiler(info).compile_regex(p))
    kernel = CudaPlatform().make_grammar_mask_apply()
    # the wait built and loaded before any wait is queued (a kernel's first launch loads its module lazily, which
    # waits for the device, i.e. for a queued wait: session 12's b1 failure, a ~20 s stall then the give-up);
    # apply_gated builds its apply on a scratch copy before it queues the wait
    from octavo.plugins.platforms.cuda_grammar_mask import wait_host_flag

    wait_host_flag(torch.zeros(2, dtype=torch.int32, pin_memory=True), 0)
    torch.cuda.synchronize()
    t_start = time.perf_counter()
    worker = XGrammarWorkerBackend(inner, 4)
    print(f"grammar worker process {worker._proc.pid} started; waiting up to {START_S:.0f} s for it", flush=True)
    try:
        assert worker.pin() and worker.rows.is_pinned() and worker.words.is_pinned()
        started = worker.wait_ready(START_S)
        print(f"grammar worker ready after {started:.2f} s (constructor to ready {time.perf_counter() - t_start:.2f} s)")
        compiled = inner.compile("(ab|cd)+x")
        matchers = [worker.matcher(compiled) for _ in range(4)]
        worker.accept_tokens(matchers[2:], [ord("a"), ord("c")])
        dg = DeviceGate(words=worker.words)
        rids = [f"r{j}" for j in range(4)]
        for step_no in range(2):
            inner_step = GrammarStep(worker, list(range(4)), rids, matchers, worker.rows, None)
            inner_step.device_gate, inner_step.seq = dg, dg.next_seq()
            gate = SimpleNamespace(inner=inner_step, seq=inner_step.seq, apply_s=0.0)
            logits = torch.randn(4, vocab)
            dev = apply_gated(logits.to("cuda"), gate, rids, lambda rows: rows, kernel)  # queued before the fill
            t0 = time.perf_counter()
            worker.post_fill(matchers, worker.rows[:4], inner_step.seq)  # the worker fills, then opens the word
            _finish_or_fail(worker, inner_step.seq, f"step {step_no}")
            print(f"step {step_no}: post + fill + device wait + apply {1e3 * (time.perf_counter() - t0):.2f} ms")
            dg.check(inner_step.seq, worker.last_error)  # (names the worker's error if its fill failed)
            want = apply_packed(logits.clone(), list(range(4)), worker.rows[:4].clone())
            assert torch.equal(dev.cpu(), want)
            allowed = torch.isfinite(want)
            if step_no == 0:  # rows 0-1 at the start; row 2 after "a", row 3 after "c"
                assert allowed[0, ord("a")] and allowed[0, ord("c")] and not allowed[0, ord("b")]
                assert allowed[2, ord("b")] and not allowed[2, ord("a")]  # after "a": only "b"
            else:  # after step 0's accepts: row 0 "a" -> only "b"; row 2 "ab" -> "a", "c" or "x"
                assert allowed[0, ord("b")] and not allowed[0, ord("a")]
                assert allowed[2, ord("x")] and allowed[2, ord("a")] and not allowed[2, ord("b")]
            worker.accept_tokens(matchers, [ord("a"), ord("c"), ord("b"), ord("d")])
    finally:
        worker.close()
