"""The grammar worker process on a GPU (plugins/structured_output/xgrammar_worker.py, OCTAVO_GRAMMAR_WORKER=1): its
shared block registers with CUDA (pinned rows and gate words), and the device gate's real wait + apply, queued
before the worker fills, read the rows the worker wrote: the masked logits equal the host apply of those rows.
A tiny byte-level vocabulary (no tokenizer files needed on the device). Skipped without CUDA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
xgr = pytest.importorskip("xgrammar")


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
    worker = XGrammarWorkerBackend(inner, 4)
    try:
        assert worker.pin() and worker.rows.is_pinned() and worker.words.is_pinned()
        compiled = inner.compile("(ab|cd)+x")
        matchers = [worker.matcher(compiled) for _ in range(4)]
        worker.accept_tokens(matchers[2:], [ord("a"), ord("c")])
        dg = DeviceGate(words=worker.words)
        kernel = CudaPlatform().make_grammar_mask_apply()
        rids = [f"r{j}" for j in range(4)]
        for _ in range(2):
            inner_step = GrammarStep(worker, list(range(4)), rids, matchers, worker.rows, None)
            inner_step.device_gate, inner_step.seq = dg, dg.next_seq()
            gate = SimpleNamespace(inner=inner_step, seq=inner_step.seq, apply_s=0.0)
            logits = torch.randn(4, vocab)
            dev = apply_gated(logits.to("cuda"), gate, rids, lambda rows: rows, kernel)  # queued before the fill
            worker.post_fill(matchers, worker.rows[:4], inner_step.seq)  # the worker fills, then opens the word
            torch.cuda.synchronize()
            dg.check(inner_step.seq)
            want = apply_packed(logits.clone(), list(range(4)), worker.rows[:4].clone())
            assert torch.equal(dev.cpu(), want)
            allowed = torch.isfinite(want)
            assert allowed[0, ord("a")] and allowed[0, ord("c")] and not allowed[0, ord("b")]
            assert allowed[2, ord("b")] and not allowed[2, ord("a")]  # after "a": only "b"
            worker.accept_tokens(matchers, [ord("a"), ord("c"), ord("b"), ord("d")])
    finally:
        worker.close()
