"""xgrammar's own multi-threaded batch fill (``xgrammar_backend.NATIVE_FILL_THREADS`` > 1: one call, xgrammar's
C++ pool) fills the same bytes as one thread, rows split or not: whatever the benchmark's ``json_async_nt8`` mode
measures on a GPU host is the same masks. Real SmolLM2 tokenizer, real xgrammar."""

from __future__ import annotations

import torch

import octavo.plugins.structured_output.xgrammar_backend as xgb
from tests.structured.test_grammar_step import mgr, schedule  # noqa: F401 - mgr is a fixture
from tests.structured.test_pipelined_fill import PREFIXES


def test_native_threads_fill_same_bytes(mgr, monkeypatch):  # noqa: F811
    out, _ = schedule(mgr, PREFIXES * 2)
    step = mgr.prepare(out)
    step.chunks = None
    ref = step.wait()[2].clone()
    mgr.accept_tokens([])
    assert (ref != -1).any(), "the prefixes constrain something"
    for threads in (2, 4, 8):
        monkeypatch.setattr(xgb, "NATIVE_FILL_THREADS", threads)
        step = mgr.prepare(out)
        step.chunks = None
        step.bitmask.fill_(0)  # stale bytes must not survive
        got = step.wait()[2]
        assert torch.equal(got, ref), threads
        assert mgr._get_backend()._local.threads == threads  # the matcher really ran on that pool
        mgr.accept_tokens([])
