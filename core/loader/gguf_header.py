"""GGUF file headers: the metadata and the tensor table, read with ``struct`` over an ``mmap``.

``gguf.GGUFReader`` walks every vocabulary string through numpy views (about 10 s for a 49k-token vocabulary
here); this reader takes ~10 ms for the embedded model. Long string arrays (the vocabulary, the merges) are only
walked for their length and kept raw (:class:`GGUFStrings`), decoded on first use: the engine core reads the
header for the config and the tensor table and never needs them (issue 18 start-up: ~40 ms of its start).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (ggml stores the fastest dimension first)
    ggml_type: int
    offset: int  # absolute, in the file


@dataclass
class GGUFHeader:
    path: str
    metadata: dict[str, Any]
    tensors: list[GGUFTensorInfo]

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]


def _read_string(buf, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    return buf[pos:pos + length].decode("utf-8", errors="replace"), pos + length


_U64 = struct.Struct("<Q").unpack_from
_LAZY_STRINGS = 256  # string arrays at least this long (vocabularies, merges) are decoded on first use


class GGUFStrings(Sequence):
    """A long GGUF string array (the vocabulary, the merges), kept as its raw bytes and decoded on first use.

    Why: the engine core reads the header for the config and the tensor table and only needs the vocabulary's
    length; decoding its ~98k strings took ~40 ms of the core's start (issue 18). The front end's tokenizer
    conversion decodes them as before (``gguf_tokenizer`` passes plain lists to transformers)."""

    __slots__ = ("_raw", "_count", "_items")

    def __init__(self, raw: bytes, count: int):
        self._raw, self._count, self._items = raw, count, None

    def __len__(self) -> int:
        return self._count

    def _decoded(self) -> list[str]:
        if self._items is None:
            items, pos = [], 0
            for _ in range(self._count):
                value, pos = _read_string(self._raw, pos)
                items.append(value)
            self._items = items
        return self._items

    def __getitem__(self, index):
        return self._decoded()[index]

    def __iter__(self):
        return iter(self._decoded())

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, GGUFStrings)) and list(self) == list(other)

    __hash__ = None  # like the list it stands for

    def __repr__(self) -> str:
        return f"GGUFStrings({self._count} strings)"


def _read_value(buf, pos: int, vtype: int):
    if vtype in _SCALAR:
        fmt = _SCALAR[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == 8:
        return _read_string(buf, pos)
    if vtype == 9:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _NUMPY:
            arr = np.frombuffer(buf, dtype=_NUMPY[etype], count=count, offset=pos)
            return arr.tolist(), pos + arr.nbytes
        if etype == 8 and count >= _LAZY_STRINGS:  # walk the lengths only; decode when used (GGUFStrings)
            start = pos
            for _ in range(count):
                pos += 8 + _U64(buf, pos)[0]
            return GGUFStrings(bytes(buf[start:pos]), count), pos
        values = []
        for _ in range(count):
            value, pos = _read_value(buf, pos, etype)
            values.append(value)
        return values, pos
    raise ValueError(f"GGUF metadata value type {vtype} is unknown; is the file a valid GGUF v2/v3?")


@lru_cache(maxsize=4)
def read_header(path: str) -> GGUFHeader:
    """Metadata and tensor table of a GGUF file (cached per path: the engine asks more than once)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it does not start with the magic bytes 'GGUF')")
        version, num_tensors, num_kv = struct.unpack_from("<IQQ", mm, 4)
        if version not in (2, 3):
            raise ValueError(f"{path} is GGUF version {version}; octavo reads versions 2 and 3")
        pos, metadata = 24, {}
        for _ in range(num_kv):
            key, pos = _read_string(mm, pos)
            (vtype,) = struct.unpack_from("<I", mm, pos)
            metadata[key], pos = _read_value(mm, pos + 4, vtype)
        entries = []
        for _ in range(num_tensors):
            name, pos = _read_string(mm, pos)
            (ndim,) = struct.unpack_from("<I", mm, pos)
            dims = struct.unpack_from(f"<{ndim}Q", mm, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", mm, pos + 4 + 8 * ndim)
            pos += 4 + 8 * ndim + 12
            entries.append((name, tuple(reversed(dims)), ggml_type, offset))
    alignment = metadata.get("general.alignment", 32)
    data_start = -(-pos // alignment) * alignment
    tensors = [GGUFTensorInfo(n, s, t, data_start + o) for n, s, t, o in entries]
    return GGUFHeader(path, metadata, tensors)
