"""The 16-character whitespace cap written as one regex rule (plugins/structured_output/xgrammar_whitespace.py)
against xgrammar's own ``max_whitespace_cnt=16``, on the real SmolLM2 tokenizer: at every token of texts
with whitespace runs of 0..17 characters in every kind of gap, both grammars accept the same tokens and
give the same next-token mask; a run past the cap is refused by both at the same token. Plus the EBNF gap
replacement leaves string literals, character classes and ``Regex("...")`` arguments alone."""

from __future__ import annotations

import json

import pytest
import torch

from octavo.config import OctavoSettings
from octavo.core.loader import load_tokenizer
from octavo.plugins.structured_output.xgrammar_schema import bounded_strings_as_patterns
from octavo.plugins.structured_output.xgrammar_whitespace import capped_whitespace_grammar, replace_gaps

xgr = pytest.importorskip("xgrammar")
VOCAB = 49152
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    "kind": {"anyOf": [{"type": "integer"}, {"enum": ["a [ \n\r\t]* b", "c"]}]},
    "sub": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
    "required": ["name", "tags"]}
TEXTS = ['{"name": "a b", "tags": ["x", "y z"], "kind": 3, "sub": {"x": 1.5}}',
         '{\n  "name": "q",\n  "tags": [\n    "t"\n  ],\n  "kind": "c"\n}',
         '{' + ' ' * 16 + '"name"' + '\n' * 16 + ':' + '\t' * 15 + '"n"' + ' \n' * 8 + ',"tags":[]' + ' ' * 16 + '}',
         '{' + ' ' * 17 + '"name": "n", "tags": []}',  # one past the cap: refused at the same token by both
         '{"name": "n",' + '\r\n' * 8 + '"tags": []}']


def test_replace_gaps_skips_literals_classes_and_regex_args():
    ebnf = 'a ::= "[ \\n\\r\\t]*" [ \\n\\r\\t]* [^\\"\\]] Regex("[ \\n\\r\\t]*") [ \\n\\r\\t]*\n'
    out, n = replace_gaps(ebnf)
    assert n == 2
    assert out == 'a ::= "[ \\n\\r\\t]*" ws_cap [^\\"\\]] Regex("[ \\n\\r\\t]*") ws_cap\n'


@pytest.fixture(scope="module")
def grammars():
    tok = load_tokenizer(OctavoSettings.from_kwargs().model)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB)
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    text = json.dumps(bounded_strings_as_patterns(SCHEMA))
    ref = compiler.compile_json_schema(text, any_whitespace=True, max_whitespace_cnt=16)
    ebnf = capped_whitespace_grammar(xgr, text, 16, "regex")
    assert ebnf is not None and "ws_cap ::=" in ebnf
    return tok, ref, compiler.compile_grammar(ebnf)


@pytest.mark.parametrize("text", TEXTS)
def test_regex_cap_equals_xgrammar_cap_token_by_token(grammars, text):
    tok, ref, ours = grammars
    a, b = xgr.GrammarMatcher(ref), xgr.GrammarMatcher(ours)
    ma, mb = (torch.empty(1, VOCAB // 32, dtype=torch.int32) for _ in range(2))
    steps = 0
    for t in tok.encode(text, add_special_tokens=False):
        a.fill_next_token_bitmask(ma)
        b.fill_next_token_bitmask(mb)
        assert torch.equal(ma, mb), (text, steps)
        ok = a.accept_token(t)
        assert b.accept_token(t) == ok
        if not ok:
            break
        steps += 1
    refused = steps < len(tok.encode(text, add_special_tokens=False))
    assert refused == (text == TEXTS[3])
    if not refused:
        assert a.is_completed() and b.is_completed()


@pytest.mark.parametrize("kind", ["json", "json_object"])
def test_backend_compiles_the_regex_cap_with_xgrammar_cap_masks(grammars, kind):
    """What the engine compiles (XGrammarBackend.compile) gives xgrammar's own capped masks along a text."""
    from octavo.plugins.structured_output.xgrammar_backend import (
        MAX_WHITESPACE,
        WHITESPACE_AS_REGEX,
        XGrammarBackend,
    )
    from octavo.structured_outputs import StructuredOutputsParams

    assert WHITESPACE_AS_REGEX and MAX_WHITESPACE == 16
    tok, ref, _ = grammars
    params = StructuredOutputsParams(json=SCHEMA) if kind == "json" else StructuredOutputsParams(json_object=True)
    backend = XGrammarBackend(tok, VOCAB)
    ours = backend.compile(params)
    XGrammarBackend.validate(params)
    if kind == "json_object":
        ref = backend.compiler.compile_json_schema('{"type": "object"}', any_whitespace=True, max_whitespace_cnt=16)
    assert "ws_cap" in str(ours.grammar)
    a, b = xgr.GrammarMatcher(ref), xgr.GrammarMatcher(ours)
    ma, mb = (torch.empty(1, VOCAB // 32, dtype=torch.int32) for _ in range(2))
    for t in tok.encode(TEXTS[2], add_special_tokens=False):
        a.fill_next_token_bitmask(ma)
        b.fill_next_token_bitmask(mb)
        assert torch.equal(ma, mb)
        assert a.accept_token(t) and b.accept_token(t)
    assert a.is_completed() and b.is_completed()
