"""The remembered model-file SHA-256 (core/loader/file_digest.py, issue 18 start-up): both processes of
``octavo serve`` reuse it, and it is used only for the very same file (device, inode, size, mtime, ctime)."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from octavo.core.loader import file_digest


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "digests"


def _old_file(path, data: bytes):
    path.write_bytes(data)
    time.sleep(file_digest.RACY_S + 0.1)  # past the racy window (ctime cannot be set back)
    return path


def test_digest_is_remembered_and_used_only_for_the_same_file(tmp_path, cache):
    f = _old_file(tmp_path / "m.gguf", b"weights" * 1000)
    assert file_digest.file_sha256(str(f)) == hashlib.sha256(f.read_bytes()).hexdigest()
    (memo,) = cache.iterdir()
    saved = json.loads(memo.read_text())
    assert saved["path"] == str(f) and saved["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    memo.write_text(json.dumps({**saved, "sha256": "ab" * 32}))  # a marked memo: is it what comes back?
    assert file_digest.file_sha256(str(f)) == "ab" * 32
    # same size, mtime set back: the ctime moved, so the file is hashed again
    st = os.stat(f)
    f.write_bytes(b"WEIGHTS" * 1000)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_digest.file_sha256(str(f)) == hashlib.sha256(b"WEIGHTS" * 1000).hexdigest()


def test_fresh_file_is_not_remembered_and_damaged_memo_is_ignored(tmp_path, cache):
    f = tmp_path / "new.gguf"
    f.write_bytes(b"x" * 100)
    assert file_digest.file_sha256(str(f)) == hashlib.sha256(b"x" * 100).hexdigest()
    assert not cache.exists() or not list(cache.iterdir())  # changed just now: racily clean, not remembered
    g = _old_file(tmp_path / "old.gguf", b"y" * 100)
    file_digest.file_sha256(str(g))
    (memo,) = cache.iterdir()
    memo.write_text("{not json")
    assert file_digest.file_sha256(str(g)) == hashlib.sha256(b"y" * 100).hexdigest()


def test_both_cache_keys_use_it(tmp_path, cache, monkeypatch):
    from octavo.core.loader import tokenizer, weights_cache_key

    f = _old_file(tmp_path / "k.gguf", b"z" * 4096)
    out: list = []
    weights_cache_key._hash_file(str(f), out)
    assert out == [hashlib.sha256(b"z" * 4096).hexdigest()] and len(list(cache.iterdir())) == 1
    calls = []
    monkeypatch.setattr(file_digest, "hash_file", lambda p, chunk=0: calls.append(p))
    key = tokenizer.gguf_tokenizer_cache_key(str(f))  # the front end's key: the remembered digest, no hash
    assert calls == [] and len(key) == 64
