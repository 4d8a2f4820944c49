"""The cheap-fill rewrite (plugins/structured_output/xgrammar_schema.py): short bounded JSON strings compile as
their regex form. Checked against xgrammar's own ``maxLength`` form on the real SmolLM2 tokenizer, token by
token: at every prefix of several JSON texts the two next-token masks are equal, except tokens holding a raw
control character (invalid inside a JSON string), which only the regex form refuses. Plus the walker itself
(nested schemas rewritten, data under enum/const/default/examples untouched, long bounds kept) and the
engine-side fill compaction (rows that need no mask are dropped, the kept rows stay in order)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from octavo.config import OctavoSettings
from octavo.core.loader import load_tokenizer
from octavo.plugins.structured_output.xgrammar_schema import (
    MAX_REWRITTEN_LENGTH,
    bounded_strings_as_patterns,
)

xgr = pytest.importorskip("xgrammar")
VOCAB = 49152


def test_walker_rewrites_nested_strings_and_leaves_data_alone():
    short = {"type": "string", "minLength": 2, "maxLength": 12}
    schema = {"type": "object", "properties": {
        "a": short, "b": {"type": "array", "items": {"type": "string", "maxLength": MAX_REWRITTEN_LENGTH + 1}},
        "c": {"type": "string", "maxLength": 5, "format": "date"}, "d": {"type": "string", "maxLength": 5, "pattern": "x"},
        "e": {"anyOf": [{"$ref": "#/$defs/s"}, {"type": "null"}]}, "f": {"type": "string", "minLength": 9, "maxLength": 3},
        "g": {"type": "string", "maxLength": True}},
        "$defs": {"s": {"type": ["string"], "maxLength": 7}},
        "default": {"a": short}, "examples": [short], "const": short, "enum": [short]}
    before = json.dumps(schema)
    out = bounded_strings_as_patterns(schema)
    assert json.dumps(schema) == before  # a copy; the request's own schema (the cache key) is not touched
    props = out["properties"]
    assert props["a"] == {"type": "string", "pattern": "^[\\s\\S]{2,12}$"}
    assert out["$defs"]["s"] == {"type": ["string"], "pattern": "^[\\s\\S]{0,7}$"}
    for key in ("b", "c", "d", "f", "g"):  # too long / other string keywords / invalid bounds: unchanged
        assert props[key] == schema["properties"][key]
    for key in ("default", "examples", "const", "enum"):
        assert out[key] == schema[key]


@pytest.fixture(scope="module")
def tok_compiler():
    tok = load_tokenizer(OctavoSettings.from_kwargs().model)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB)
    return tok, xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)


def _masks(compiler, tok, schema, text):
    """The next-token bitmask at every token prefix of ``text`` (accepted token by token)."""
    m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=True,
                                                        max_whitespace_cnt=16))
    buf = torch.empty(1, VOCAB // 32, dtype=torch.int32)
    out = []
    for t in tok.encode(text, add_special_tokens=False):
        m.fill_next_token_bitmask(buf, 0)
        out.append(buf[0].numpy().view(np.uint32).copy())
        assert m.accept_token(t), (text, t)
    return out


def _bits(words):
    return ((words[:, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(-1).astype(bool)


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
    "required": ["name", "tags"]}
TEXTS = ['{"name": "Item 12", "tags": ["ab", "cdef", "x"]}',
         '{\n  "name": "éà😀 ok",\n  "tags": [\n    "Item 1",\n    ""\n  ]\n}',
         '{"name": "a", "tags": []}']


@pytest.mark.parametrize("text", TEXTS)
def test_regex_form_masks_equal_maxlength_form_except_control_chars(tok_compiler, text):
    tok, compiler = tok_compiler
    control = np.zeros(VOCAB, dtype=bool)
    for i in range(len(tok)):
        s = tok.decode([i])
        control[i] = any(ord(c) < 0x20 for c in s)
    orig = _masks(compiler, tok, SCHEMA, text)
    fast = _masks(compiler, tok, bounded_strings_as_patterns(SCHEMA), text)
    assert len(orig) == len(fast) > 5
    for a, b in zip(orig, fast):
        ba, bb = _bits(a), _bits(b)
        assert not (bb & ~ba).any()  # the regex form never allows more
        extra = ba & ~bb
        assert not (extra & ~control).any(), [tok.decode([i]) for i in np.flatnonzero(extra & ~control)[:10]]


def test_fill_drops_open_rows_in_order():
    from concurrent.futures import ThreadPoolExecutor

    from octavo.core.grammar_step import GrammarStep
    from octavo.structured_outputs import GrammarMatcher

    class Row(GrammarMatcher):
        def __init__(self, value):
            self.value = value


    class Backend:
        def fill_bitmasks(self, matchers, bitmask):
            for j, m in enumerate(matchers):
                bitmask[j] = m.value

    values = [-1, 5, -1, 7, 9, -1]
    buf = torch.zeros(8, 4, dtype=torch.int32)
    with ThreadPoolExecutor(1) as pool:
        step = GrammarStep(Backend(), list(range(6)), list("abcdef"), [Row(v) for v in values], buf, pool)
        step.start()
        rids, positions, packed = step.wait()
    assert rids == ["b", "d", "e"] and positions == [1, 3, 4]
    assert packed.tolist() == [[5] * 4, [7] * 4, [9] * 4]


@pytest.mark.parametrize("n", [2, 3])  # 1 live row left (per-row fill), 2 (batched fill with indices)
def test_grammar_that_accepted_eos_is_not_masked_further(n):
    """Under ignore_eos a request goes on after its grammar accepted EOS: the next fill leaves its row open
    (as vLLM) instead of failing the step (xgrammar raises when asked for a terminated matcher's mask)."""
    from octavo.core.messages import EngineCoreRequest
    from octavo.core.request import Request
    from octavo.core.scheduler import ScheduledRequest
    from octavo.core.structured_output import StructuredOutputManager
    from octavo.sampling_params import SamplingParams
    from octavo.structured_outputs import StructuredOutputsParams

    settings = OctavoSettings.from_kwargs()
    tok = load_tokenizer(settings.model)
    mgr = StructuredOutputManager(settings, VOCAB, [tok.eos_token_id])
    reqs = []
    for i in range(n):
        params = SamplingParams(ignore_eos=True, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
        reqs.append(Request(EngineCoreRequest(f"t{i}", [1], params, 0.0), 64))
        mgr.add_request(reqs[-1])
        reqs[-1].grammar.future.result(timeout=60)

    class Out:
        scheduled = [ScheduledRequest(r, 1, 0, [0]) for r in reqs]

    try:
        for t in tok.encode("yes", add_special_tokens=False) + [tok.eos_token_id]:
            mgr.prepare(Out).wait()
            reqs[0].append_output_token(t)
            mgr.accept_tokens([(reqs[0], t)])
        assert reqs[0].grammar.matcher.is_terminated()
        rids, positions, packed = mgr.prepare(Out).wait()
        assert rids == [f"t{i}" for i in range(1, n)] and positions == list(range(1, n))
        assert packed.shape[0] == n - 1 and (packed != -1).any(1).all()
        mgr.accept_tokens([])
    finally:
        mgr.shutdown()


@pytest.mark.parametrize(("lo", "hi"), [(0, 0), (1, 1), (2, 3)])
def test_regex_form_accepts_the_same_lengths(tok_compiler, lo, hi):
    _, compiler = tok_compiler
    schema = {"type": "string", "minLength": lo, "maxLength": hi}

    def accepted(s):
        cg = compiler.compile_json_schema(json.dumps(s), any_whitespace=False)
        out = []
        for text in ['""', '"a"', '"ab"', '"abc"', '"abcd"', '"éà😀"']:
            m = xgr.GrammarMatcher(cg)
            out.append(m.accept_string(text) and m.is_completed())
        return out

    want = accepted(schema)
    assert want.count(True) >= 1
    assert accepted(bounded_strings_as_patterns(schema)) == want
