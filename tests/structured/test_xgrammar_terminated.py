"""The xgrammar backend keeps a matcher's "terminated" state in Python (plugins/structured_output/xgrammar_backend.py
``_Matcher``): after every accepted or refused token, on the batched path (``accept_tokens``) and the single one
(``accept_token``), and after ``reset``, it equals xgrammar's own ``is_terminated()``. Random walks through a
JSON schema and a choice on the real SmolLM2 tokenizer, each step taking an allowed token (the stop token as soon
as it is allowed, for half the rows), plus refused tokens (a disallowed one, and one after termination)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from octavo.config import OctavoSettings
from octavo.core.loader import load_tokenizer
from octavo.structured_outputs import StructuredOutputsParams

xgr = pytest.importorskip("xgrammar")
VOCAB = 49152


@pytest.fixture(scope="module")
def backend():
    from octavo.plugins.structured_output.xgrammar_backend import XGrammarBackend

    return XGrammarBackend(load_tokenizer(OctavoSettings.from_kwargs().model), VOCAB)


def _allowed(matcher, row_mask: torch.Tensor) -> np.ndarray:
    matcher.fill_bitmask(row_mask, 0)
    bits = np.unpackbits(row_mask.numpy().view(np.uint8), bitorder="little")[:VOCAB]
    return np.flatnonzero(bits)


@pytest.mark.parametrize("params", [
    StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                            disable_any_whitespace=True),
    StructuredOutputsParams(choice=["yes", "no way"]),
])
def test_python_terminated_flag_equals_xgrammars(backend, params):
    compiled = backend.compile(params)
    rng = random.Random(0)
    matchers = [backend.matcher(compiled) for _ in range(6)]
    mask = torch.full((1, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    for step in range(40):
        live = [m for m in matchers if not m.is_terminated()]
        if not live:
            break
        tokens = []
        for j, m in enumerate(live):
            allowed = _allowed(m, mask)
            stops = [t for t in allowed if t in m._stop]
            tokens.append(stops[0] if stops and j % 2 == 0 else rng.choice(list(allowed)))
        if step % 2:
            ok = backend.accept_tokens(live, tokens)
        else:
            ok = [m.accept_token(t) for m, t in zip(live, tokens)]
        assert all(ok)
        for m in matchers:
            assert m.is_terminated() == m.m.is_terminated()
    terminated_seen = sum(m.is_terminated() for m in matchers)
    assert terminated_seen == len(matchers)  # every walk ended by its stop token
    m = matchers[0]
    assert m.accept_token(next(iter(m._stop))) is False and m.is_terminated() and m.m.is_terminated()
    m.reset()
    assert not m.is_terminated() and not m.m.is_terminated()
    bad = [t for t in range(VOCAB) if t not in set(_allowed(m, mask).tolist())][0]
    assert m.accept_token(bad) is False and m.is_terminated() == m.m.is_terminated() is False


def test_batch_accept_readback_equals_xgrammars(backend, monkeypatch):
    """The batched accept reads the native result without GIL-releasing FFI calls (``_batch_accept``): the same
    accepted / refused answers and the same matcher states as xgrammar's own ``batch_accept_token``, row by row."""
    from octavo.plugins.structured_output import xgrammar_match as xgb

    compiled = backend.compile(StructuredOutputsParams(json={"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"]}, disable_any_whitespace=True))
    mask = torch.full((1, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    ours = [backend.matcher(compiled) for _ in range(8)]
    ref = [backend.matcher(compiled) for _ in range(8)]
    rng = random.Random(1)
    refused = 0
    for _ in range(12):
        live = [j for j, m in enumerate(ref) if not m.m.is_terminated()]
        if not live:
            break
        tokens = []
        for j in live:
            m = ref[j]
            allowed = _allowed(m, mask).tolist()
            bad = [t for t in range(200) if t not in set(allowed)]
            walk = [t for t in allowed if t not in m._stop] or allowed
            tokens.append(bad[j % len(bad)] if j % 3 == 0 and bad else rng.choice(walk))
        got = xgb._batch_accept(xgr, [ours[j].m for j in live], tokens)
        want = xgr.BatchGrammarMatcher.batch_accept_token([ref[j].m for j in live], tokens)
        assert got == [bool(w) for w in want] and all(isinstance(g, bool) for g in got)
        refused += got.count(False)
        for a, b in zip(ours, ref):
            assert a.m.is_terminated() == b.m.is_terminated()
            if not b.m.is_terminated():
                assert np.array_equal(_allowed(a, mask), _allowed(b, mask))
    assert refused > 0 and "getter" in xgb._READBACK  # the read-back path ran, and saw refusals
    fn = xgb._READBACK["core"].BatchGrammarMatcher.batch_accept_token
    assert fn.release_gil  # (default: the call releases the GIL)
    monkeypatch.setattr(xgb, "ACCEPT_KEEPS_GIL", True)  # OCTAVO_GRAMMAR_ACCEPT_KEEPS_GIL=1: same answers, GIL kept
    assert xgb._batch_accept(xgr, [backend.matcher(compiled).m for _ in range(2)], [0, 0]) == [False, False]
    assert not fn.release_gil
    monkeypatch.setattr(xgb, "ACCEPT_KEEPS_GIL", False)
    assert xgb._batch_accept(xgr, [backend.matcher(compiled).m for _ in range(2)], [0, 0]) == [False, False]
    assert fn.release_gil
    monkeypatch.setattr(xgb, "ACCEPT_READBACK_KEEPS_GIL", False)  # the public call: same contract
    assert xgb._batch_accept(xgr, [backend.matcher(compiled).m for _ in range(2)], [0, 0]) == [False, False]


def test_steady_batch_accept_and_fill_on_one_list_equal_xgrammars(backend):
    """The engine passes the same matchers list every steady step (core/grammar_rows.py); the backend keeps its
    per-batch lists for it (``_accept_rows``, the fill's ``rows``). Walked on one list until every row stops: the
    answers, the terminated flags and each step's rows equal xgrammar's own on reference matchers, and a row whose
    matcher terminated is all ones in the next fill; a new list (another batch) is taken as new."""
    compiled = backend.compile(StructuredOutputsParams(choice=["yes", "no way", "maybe not"]))
    ours = [backend.matcher(compiled) for _ in range(6)]
    ref = [xgr.GrammarMatcher(compiled) for _ in range(6)]
    words = (VOCAB + 31) // 32
    rows, want = torch.zeros(6, words, dtype=torch.int32), torch.zeros(6, words, dtype=torch.int32)
    rng = random.Random(3)
    stopped = full = 0
    for _ in range(40):
        backend.fill_bitmasks(ours, rows)
        for j, m in enumerate(ref):
            if m.is_terminated():
                want[j].fill_(-1)
            else:
                m.fill_next_token_bitmask(want, j)
        assert torch.equal(rows, want)
        if all(m.is_terminated() for m in ref):
            break
        tokens = []
        for j in range(6):
            bits = np.unpackbits(want[j].numpy().view(np.uint8), bitorder="little")[:VOCAB]
            allowed = np.flatnonzero(bits).tolist()
            stops = [t for t in allowed if t in ours[j]._stop]
            tokens.append(stops[0] if stops and rng.random() < 0.5 else rng.choice(allowed))
        live = [j for j in range(6) if not ref[j].is_terminated()]
        if len(live) == 6:  # the full batch: the same list object every step
            got = backend.accept_tokens(ours, tokens)
            full += backend._accept_rows[0] is ours and backend._accept_rows[1]
        else:
            got = backend.accept_tokens([ours[j] for j in live], [tokens[j] for j in live])
        assert got == [ref[j].accept_token(tokens[j]) for j in live]
        assert [m.is_terminated() for m in ours] == [m.is_terminated() for m in ref]
        stopped = sum(m.is_terminated() for m in ref)
    assert stopped == 6 and full >= 2  # every row stopped; the kept lists were used on consecutive steps
