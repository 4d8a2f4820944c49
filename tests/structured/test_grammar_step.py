"""The per-step grammar path (core/grammar_step.py) without a model: the bitmask filled on the host thread
(``start`` / ``wait``, what the in-process executor does while the forward runs) equals the serial fill shipped
as bytes (``attach``, what out-of-process executors get); rows the grammar leaves fully open are not masked;
the table-add apply sets exactly the disallowed logits to -inf (checked bit by bit against numpy, fp32 and
bf16, all rows and a subset, a vocabulary that is not a multiple of 32); and the runner's ``mask_logits``
gives the same logits from either form. Real SmolLM2 tokenizer and the real xgrammar backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.config import OctavoSettings
from octavo.core.grammar_step import GrammarStep, apply_packed, mask_logits
from octavo.core.loader import load_tokenizer
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request
from octavo.core.scheduler import ScheduledRequest
from octavo.core.structured_output import StructuredOutputManager
from octavo.executor import Executor
from octavo.sampling_params import SamplingParams
from octavo.step import ScheduledRequestData
from octavo.structured_outputs import GrammarMatcher, StructuredOutputsParams

VOCAB = 49152
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "n": {"type": "integer"}}, "required": ["name", "n"]}


def reference(logits: torch.Tensor, rows: list[int], packed: torch.Tensor) -> torch.Tensor:
    words = packed.numpy().view(np.uint32)
    bits = ((words[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(len(rows), -1)
    out = logits.clone()
    for j, r in enumerate(rows):
        out[r, torch.from_numpy(bits[j, :logits.shape[1]] == 0)] = float("-inf")
    return out


@pytest.mark.parametrize("vocab", [VOCAB, 1000 * 32 + 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_packed_matches_bitwise_reference(vocab, dtype):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=g).to(dtype)
    packed = torch.randint(-2**31, 2**31 - 1, (6, (vocab + 31) // 32), dtype=torch.int32, generator=g)
    assert torch.equal(apply_packed(logits.clone(), list(range(6)), packed), reference(logits, list(range(6)), packed))
    rows = [1, 4, 5]
    assert torch.equal(apply_packed(logits.clone(), rows, packed[:3]), reference(logits, rows, packed[:3]))


@pytest.fixture(scope="module")
def mgr():
    settings = OctavoSettings.from_kwargs()
    tok = load_tokenizer(settings.model)
    m = StructuredOutputManager(settings, VOCAB, [tok.eos_token_id])
    m.tok = tok
    yield m
    m.shutdown()


def schedule(mgr, prefixes: list[str]):
    """A scheduled step of requests under SCHEMA, each advanced through its prefix; one unconstrained in between."""
    scheduled, data = [], []
    for i, prefix in enumerate(prefixes):
        so = StructuredOutputsParams(json=SCHEMA) if prefix is not None else None
        req = Request(EngineCoreRequest(f"q{i}", [1], SamplingParams(structured_outputs=so), 0.0), 64)
        mgr.add_request(req)
        if so is not None:
            req.grammar.future.result(timeout=60)
            for t in mgr.tok.encode(prefix, add_special_tokens=False):
                req.append_output_token(t)
        scheduled.append(ScheduledRequest(req, 1, req.num_tokens - 1, [0]))
        data.append(ScheduledRequestData(req.request_id, [], 0, [0], True))

    class Out:
        pass

    class Batch:
        pass

    Out.scheduled, Batch.scheduled = scheduled, data
    return Out, Batch


def test_threaded_fill_equals_serial_bytes_and_runner_masks_alike(mgr):
    prefixes = ['{"name": "ab', None, '{"name": "x", "n": 1', "", '{"na']
    out, batch = schedule(mgr, prefixes)
    step = mgr.prepare(out)
    assert step.positions == [0, 2, 3, 4]
    step.start()
    rids, positions, packed = step.wait()
    threaded = {r: packed[j].clone() for j, r in enumerate(rids)}
    mgr.accept_tokens([])  # the in-flight step is over
    serial = mgr.prepare(out)
    serial.attach(batch)
    assert set(threaded) == {batch.scheduled[i].request_id for i in positions}
    for s in batch.scheduled:
        if s.request_id in threaded:
            assert np.array_equal(np.frombuffer(s.grammar_bitmask, dtype=np.int32), threaded[s.request_id].numpy())
        else:
            assert s.grammar_bitmask is None
    ids = [s.request_id for s in batch.scheduled]
    logits = torch.randn(len(ids), VOCAB)
    from_bytes = mask_logits(logits.clone(), batch, ids, lambda rows: rows)
    again = mgr.prepare(out)
    from_step = mask_logits(logits.clone(), type("NoBytes", (), {"scheduled": []}), ids, lambda rows: rows, again)
    assert torch.equal(from_bytes, from_step)
    assert torch.isfinite(from_bytes[1]).all()  # the unconstrained request is untouched
    assert 0 < torch.isinf(from_bytes[0]).sum() < VOCAB // 2  # inside a JSON string most tokens are allowed,
    assert torch.isinf(from_bytes[3]).sum() > VOCAB - 1000  # but at the start only "{" and whitespace are
    mgr.accept_tokens([])


class _Open(GrammarMatcher):
    """A matcher whose grammar allows every token (the real backends never leave a SmolLM2 row fully open)."""

    def fill_bitmask(self, bitmask, row):
        bitmask[row] = -1

    def is_terminated(self):
        return False


def test_fully_open_rows_are_not_masked_and_default_executor_ships_bytes(mgr):
    backend = mgr._get_backend()
    out, batch = schedule(mgr, ['{"name": "ab'])
    real = mgr.prepare(out).matchers[0]
    mgr.accept_tokens([])
    buf = torch.zeros(3, VOCAB // 32, dtype=torch.int32)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        step = GrammarStep(backend, [0, 1, 2], ["a", "b", "c"], [_Open(), real, _Open()], buf, pool)
        step.start()
        rids, positions, packed = step.wait()
    assert rids == ["b"] and positions == [1] and packed.shape == (1, VOCAB // 32)

    class Recorder(Executor):
        def execute(self, b):
            self.seen = [s.grammar_bitmask is not None for s in b.scheduled]
            return "ran"

    ex = Recorder(None, None, "")
    out, batch = schedule(mgr, ['{"name": "ab', None])
    assert ex.execute_structured(batch, mgr.prepare(out)) == "ran" and ex.seen == [True, False]
    mgr.accept_tokens([])


def test_step_loop_masks_equal_xgrammar_row_by_row(mgr):
    """The engine's loop (batched accept, then the next fill): every row of every step equals a fresh xgrammar
    matcher's own mask after the same tokens (real tokenizer, the backend's compiled grammar), on both fill
    paths (started on the pool, and filled inline by ``wait``)."""
    import xgrammar as xgr

    texts = ['{"name": "abc", "n": 12}', '{\n  "name": "Zoë",\n  "n": -3\n}', '{"name":"","n":0}']
    token_lists = [mgr.tok.encode(t, add_special_tokens=False) for t in texts]
    out, _ = schedule(mgr, [""] * len(texts))
    reqs = [s.req for s in out.scheduled]
    compiled = reqs[0].grammar.future.result()
    backend = mgr._get_backend()
    ref = xgr.allocate_token_bitmask(1, VOCAB)
    for k in range(max(map(len, token_lists))):
        live = [j for j, toks in enumerate(token_lists) if k < len(toks)]
        out.scheduled = [ScheduledRequest(reqs[j], 1, reqs[j].num_tokens - 1, [0]) for j in live]
        step = mgr.prepare(out)
        if k % 2 == 0:
            step.start()
        rids, positions, packed = step.wait()
        assert rids == [reqs[j].request_id for j in live]  # JSON inside an object is never fully open
        for row, j in enumerate(live):
            m = xgr.GrammarMatcher(compiled)
            assert all(m.accept_token(t) for t in token_lists[j][:k])
            m.fill_next_token_bitmask(ref, 0)
            assert torch.equal(packed[row], ref[0]), (texts[j], k)
        updates = []
        for j in live:
            reqs[j].append_output_token(token_lists[j][k])
            updates.append((reqs[j], token_lists[j][k]))
        mgr.accept_tokens(updates)
    assert all(r.grammar.matcher.m.is_completed() for r in reqs), "every text is a complete JSON value"
    assert backend.accept_tokens([], []) == []
