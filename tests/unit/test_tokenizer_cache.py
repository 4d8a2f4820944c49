"""The converted GGUF tokenizer is cached by file hash and the cached copy behaves exactly like a fresh
conversion: same ids, same decoding, same special tokens and chat template (issue 18, start-up)."""

from __future__ import annotations

import os

import pytest

from octavo.core.loader import default_model_path
from octavo.core.loader import tokenizer as tokmod
from octavo.core.loader.gguf_file import gguf_tokenizer

TEXTS = ["Hello world, the capital of France is", "  leading spaces\tand tabs\n\nnewlines", "naïve café 東京 🙂",
         "def f(x):\n    return x ** 2  # comment", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def gguf():
    return default_model_path()


@pytest.fixture(scope="module")
def fresh(gguf):
    return gguf_tokenizer(gguf)


def test_cache_hit_equals_fresh_conversion(gguf, fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    first = tokmod.cached_gguf_tokenizer(gguf)  # miss: converts and writes the entry
    entry = tmp_path / "tokenizers" / tokmod.gguf_tokenizer_cache_key(gguf)
    assert (entry / "tokenizer.json").is_file()
    assert not [p for p in os.listdir(tmp_path / "tokenizers") if p.startswith(".tmp-")]

    def no_conversion(path):
        raise AssertionError("a cache hit must not convert the GGUF tokenizer again")

    monkeypatch.setattr("octavo.core.loader.gguf_file.gguf_tokenizer", no_conversion)
    cached = tokmod.cached_gguf_tokenizer(gguf)  # hit
    for tok in (first, cached):
        for text in TEXTS:
            ids = fresh(text).input_ids
            assert tok(text).input_ids == ids
            assert tok(text, add_special_tokens=False).input_ids == fresh(text, add_special_tokens=False).input_ids
            assert tok.decode(ids) == fresh.decode(ids)
            assert tok.decode(ids, skip_special_tokens=True) == fresh.decode(ids, skip_special_tokens=True)
        for name in ("bos_token", "eos_token", "unk_token", "pad_token", "bos_token_id", "eos_token_id"):
            assert getattr(tok, name) == getattr(fresh, name), name
        assert tok.chat_template == fresh.chat_template and tok.chat_template
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
            fresh.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert len(tok) == len(fresh)


def test_key_follows_file_content(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + b"\0" * 100)
    b.write_bytes(b"GGUF" + b"\0" * 99 + b"\1")
    assert tokmod.gguf_tokenizer_cache_key(str(a)) != tokmod.gguf_tokenizer_cache_key(str(b))
    b.write_bytes(a.read_bytes())
    assert tokmod.gguf_tokenizer_cache_key(str(a)) == tokmod.gguf_tokenizer_cache_key(str(b))


def test_unwritable_cache_still_loads(gguf, fresh, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(blocker))  # makedirs under a file fails
    tok = tokmod.cached_gguf_tokenizer(gguf)
    assert tok(TEXTS[0]).input_ids == fresh(TEXTS[0]).input_ids


def test_settings_accept_the_cache_env_var(monkeypatch, tmp_path):
    from octavo.config import OctavoSettings

    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))
    OctavoSettings.from_kwargs(model="x")  # an OCTAVO_ variable that is not a setting must not be refused
