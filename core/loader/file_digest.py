"""SHA-256 of a model file, remembered across processes by the file's identity (issue 18: start-up).

Why: both processes of ``octavo serve`` hashed the same GGUF file at every start, the front end for its tokenizer
cache key (``tokenizer.py``) and the engine core for its processed-weights cache key (``weights_cache_key.py``):
~0.1 s of CPU each on a 2-vCPU machine for the embedded 100 MB model, more for larger files. The digest is now
kept in ``$OCTAVO_CACHE_DIR/digests/`` next to the file's device, inode, size, mtime and ctime (nanoseconds);
any change to the file changes its ctime (which no user call can set back), so a remembered digest is used only
for the very same bytes, and any mismatch, unreadable or damaged memo means hashing again. Memos that cannot be
written (read-only cache) only cost the hash each time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time

#: a file changed less than this long ago is hashed but not remembered (file timestamps are coarse: ~ms ticks)
RACY_S = 2.0


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _memo_path(path: str) -> str:
    # the folder of tokenizer.cache_root(), not imported from there: tokenizer.py imports this module
    root = os.environ.get("OCTAVO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "octavo")
    name = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:32]
    return os.path.join(root, "digests", f"{name}.json")


def hash_file(path: str, chunk: int = 1 << 23) -> str:
    """SHA-256 (hex) of the file's bytes, read in ``chunk``-byte pieces (hashlib and read drop the GIL)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str) -> str:
    """SHA-256 (hex) of ``path``'s bytes: the remembered one when the file is exactly the one it was taken of."""
    path = os.path.abspath(path)
    before = _identity(os.stat(path))
    memo = _memo_path(path)
    try:
        with open(memo) as f:
            saved = json.load(f)
        if saved.get("path") == path and saved.get("identity") == before and len(saved.get("sha256", "")) == 64:
            return saved["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = hash_file(path)
    after = os.stat(path)
    if _identity(after) != before:  # changed while it was read: give the digest, remember nothing
        return digest
    if time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) < RACY_S * 1e9:
        return digest  # "racily clean" (as git says): a same-size rewrite within the clock's tick could look the same
    try:
        os.makedirs(os.path.dirname(memo), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(memo), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"path": path, "identity": before, "sha256": digest}, f)
        os.replace(tmp, memo)
    except OSError:
        pass
    return digest
