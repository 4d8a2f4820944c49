"""The GGUF header reader (core/loader/gguf_header.py): long string arrays (vocabularies, merges) are kept raw and
decoded on first use (issue 18 start-up: the engine core needs only their length), and read back exactly what
the ``gguf`` package wrote, with the tensor table after them at the right offsets."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from octavo.core.loader.gguf_file import gguf_config_dict  # noqa: E402
from octavo.core.loader.gguf_header import GGUFStrings, read_header  # noqa: E402


def _write(path, tokens, languages):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_array("general.languages", languages)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_uint32("test.after", 7)  # a scalar after the long array: the skip must land on it
    w.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_long_string_arrays_read_lazily_and_exactly(tmp_path):
    tokens = [f"tok{i}" for i in range(300)] + ["é", "日本", "", " space", "\n"]  # non-ASCII and empty strings
    path = tmp_path / "t.gguf"
    _write(path, tokens, ["en", "fr"])
    read_header.cache_clear()
    header = read_header(str(path))
    meta = header.metadata
    lazy = meta["tokenizer.ggml.tokens"]
    assert isinstance(lazy, GGUFStrings) and len(lazy) == len(tokens)
    assert lazy._items is None  # nothing decoded yet: the length is known from the walk
    assert list(lazy) == tokens and lazy == tokens and lazy[300] == "é" and lazy[-1] == "\n"
    assert meta["general.languages"] == ["en", "fr"] and type(meta["general.languages"]) is list  # short: a list
    assert meta["tokenizer.ggml.token_type"] == [1] * len(tokens) and meta["test.after"] == 7
    assert [t.name for t in header.tensors] == ["token_embd.weight", "output_norm.weight"]
    assert header.tensors[0].shape == (3, 4)
    # the tensor data sit where the table says: read back the first tensor through the recorded offset
    data = np.fromfile(path, dtype=np.float32, count=12, offset=header.tensors[0].offset)
    assert data.tolist() == list(range(12))
    assert gguf_config_dict(header)["vocab_size"] == len(tokens)
