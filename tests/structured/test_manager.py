"""The engine core's grammar side without a model: the real tokenizer of the embedded SmolLM2 and the real
xgrammar backend drive ``StructuredOutputManager`` the way ``EngineCore.step`` does (schedule -> bitmask into
the step -> accept the sampled token), and ``apply_bitmask`` masks exactly the disallowed logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.config import OctavoSettings
from octavo.core.loader import load_tokenizer
from octavo.core.messages import EngineCoreRequest
from octavo.core.request import Request
from octavo.core.scheduler import ScheduledRequest
from octavo.core.structured_output import StructuredOutputManager, apply_bitmask
from octavo.sampling_params import SamplingParams
from octavo.step import ScheduledRequestData
from octavo.structured_outputs import StructuredOutputsParams

VOCAB = 49152


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(OctavoSettings.from_kwargs().model)


def make(settings, tok, prompt: str, so: StructuredOutputsParams, rid: str = "r") -> tuple:
    mgr = StructuredOutputManager(settings, VOCAB, [tok.eos_token_id])
    req = Request(EngineCoreRequest(rid, tok(prompt).input_ids, SamplingParams(structured_outputs=so), 0.0), 64)
    mgr.add_request(req)
    req.grammar.future.result(timeout=60)
    return mgr, req


def step(mgr, req) -> np.ndarray | None:
    """One engine step's bitmask for ``req`` as a bool array over the vocabulary (None: no constraint)."""
    sched = ScheduledRequest(req, 1, req.num_tokens - 1, [0])
    data = ScheduledRequestData(req.request_id, [], req.num_tokens - 1, [0], True)

    class Out:
        scheduled = [sched]

    class Batch:
        scheduled = [data]

    mgr.attach_bitmasks(Out, Batch)
    if data.grammar_bitmask is None:
        return None
    words = np.frombuffer(data.grammar_bitmask, dtype=np.int32)
    return ((words[:, None] >> np.arange(32)) & 1).astype(bool).reshape(-1)[:VOCAB]


def emit(mgr, req, token: int) -> None:
    req.append_output_token(token)
    mgr.accept_tokens([(req, token)])


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_choice_bitmask_steps_to_eos(tok, backend):
    settings = OctavoSettings.from_kwargs(structured_outputs_backend=backend)
    mgr, req = make(settings, tok, "Answer:", StructuredOutputsParams(choice=["yes", "no"]))
    for token in tok("yes", add_special_tokens=False).input_ids:
        allowed = step(mgr, req)
        assert allowed[token] and allowed.sum() < 10
        assert all(("yes".startswith(t) or "no".startswith(t)) for t in
                   (tok.decode([i]) for i in np.flatnonzero(allowed)))
        emit(mgr, req, token)
    allowed = step(mgr, req)
    assert list(np.flatnonzero(allowed)) == [tok.eos_token_id]  # complete: only end of sequence


def test_grammar_cache_is_shared_by_spec(tok):
    settings = OctavoSettings.from_kwargs()
    mgr = StructuredOutputManager(settings, VOCAB, [tok.eos_token_id])
    reqs = [Request(EngineCoreRequest(f"r{i}", [1, 2], SamplingParams(structured_outputs=so), 0.0), 8)
            for i, so in enumerate([StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
                                    StructuredOutputsParams(json='{"properties": {"a": {"type": "integer"}}, "type": "object"}'),
                                    StructuredOutputsParams(regex="a+")])]
    for r in reqs:
        mgr.add_request(r)
    assert reqs[0].grammar.future is reqs[1].grammar.future  # same schema, key order aside
    assert reqs[2].grammar.future is not reqs[0].grammar.future
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        mgr.add_request(Request(EngineCoreRequest("bad", [1], SamplingParams(
            structured_outputs=StructuredOutputsParams(regex="(")), 0.0), 8))
    mgr.shutdown()


def test_grammar_starts_after_reasoning_ends(tok):
    settings = OctavoSettings.from_kwargs(reasoning_parser="deepseek_r1")
    mgr, req = make(settings, tok, "<think>", StructuredOutputsParams(choice=["A"]))
    for token in tok("hmm, B or A", add_special_tokens=False).input_ids:
        assert step(mgr, req) is None  # still reasoning: unconstrained
        emit(mgr, req, token)
    for token in tok("</think>", add_special_tokens=False).input_ids:
        emit(mgr, req, token)
    allowed = step(mgr, req)
    assert allowed is not None and allowed[tok("A", add_special_tokens=False).input_ids[0]]
    assert not allowed[tok("B", add_special_tokens=False).input_ids[0]]
    # a prompt that already closed the reasoning constrains from the first token
    mgr2, req2 = make(settings, tok, "<think>ok</think>", StructuredOutputsParams(choice=["A"]))
    assert step(mgr2, req2) is not None
    # an earlier turn's reasoning in the prompt does not count when the prompt opens a new one
    mgr3, req3 = make(settings, tok, "<think>ok</think> A. Again? <think>\n", StructuredOutputsParams(choice=["A"]))
    assert step(mgr3, req3) is None


def test_apply_bitmask_masks_only_disallowed_rows_and_tokens():
    logits = torch.randn(3, VOCAB)
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[[0, 31, 32, 4097, VOCAB - 1]] = True
    bits = np.zeros(VOCAB // 32, dtype=np.uint32)
    for t in allowed.nonzero().flatten().tolist():
        bits[t // 32] |= np.uint32(1 << (t % 32))
    mask = bits.view(np.int32).tobytes()  # bit 31 is the int32 sign bit
    out = apply_bitmask(logits.clone(), [1], [mask])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert torch.equal(torch.isfinite(out[1]), allowed)
