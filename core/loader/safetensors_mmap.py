"""Safetensors shards read as zero-copy views of a memory map, with the kernel reading ahead (issue 17 item 4).

``safe_open(...).get_tensor`` copies every tensor out of its memory map into a fresh host tensor before the
model copies it again to the device: for a 16 GB Llama-3-8B checkpoint that is 16 GB of extra host memcpy on
the start path. Here each tensor is ``torch.frombuffer`` over a private (copy-on-write) ``mmap`` of its shard, so
the only copy is the model's own ``weight_loader`` (host -> device, or into the CPU parameter); and every shard
is announced to the kernel with ``posix_fadvise(WILLNEED)`` up front, so pages of later shards are read from disk
while earlier ones are being copied.

The format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data, offsets
relative to byte 8 + N.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from math import prod

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
for _name, _attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _attr):
        _DTYPES[_name] = getattr(torch, _attr)


def read_header(path: str) -> tuple[dict, int]:
    """``(tensor entries without __metadata__, byte offset of the data)`` of one shard."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100 << 20:
            raise ValueError(f"{path}: safetensors header of {n} bytes; is this a safetensors file?")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def num_tensors(paths: list[str]) -> int:
    return sum(len(read_header(p)[0]) for p in paths)


def iter_safetensors(paths: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, CPU tensor)`` of every shard in file order; tensors are read-only-by-convention views of the map
    (writes stay private to this process) and keep their shard's map alive as long as they are referenced."""
    for path in paths:  # ask the kernel to start reading every shard now; cheap if they are cached already
        if hasattr(os, "posix_fadvise"):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
    for path in paths:
        header, data_start = read_header(path)
        size = os.path.getsize(path)
        if size == data_start:  # no tensor data at all (mmap of an empty range fails)
            continue
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = _DTYPES.get(entry["dtype"])
            if dtype is None:
                raise ValueError(f"{path}: tensor {name} has dtype {entry['dtype']}, which torch cannot hold")
            begin, end = entry["data_offsets"]
            shape = tuple(entry["shape"])
            count = prod(shape)
            if end - begin != count * dtype.itemsize or data_start + end > size:
                raise ValueError(f"{path}: tensor {name} ({entry['dtype']} {list(shape)}) has {end - begin} bytes "
                                 f"at [{begin}, {end}); the file is damaged or truncated")
            if count == 0:
                yield name, torch.empty(shape, dtype=dtype)
                continue
            yield name, torch.frombuffer(mm, dtype=dtype, count=count, offset=data_start + begin).view(shape)
        del mm  # the tensors still referenced keep the map alive
