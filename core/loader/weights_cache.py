"""The loaded, processed weights of a GGUF model on the CPU, cached on disk and memory-mapped back (issue 18 item 5).

Why: building the embedded model costs ~1-1.4 s of every ``octavo serve`` start on a 2-vCPU machine (GGUF
dequantize, 4-bit repack into the CPU kernel's layout, the int8 copy of the LM head), the largest part of the
start after ``import torch``. The result depends only on the GGUF file, octavo's code and the load settings, so
the first load writes every module's final parameters and buffers to ``$OCTAVO_CACHE_DIR/weights/<key>.bin``
(next to the tokenizer cache) and later loads map that file instead (``torch.frombuffer`` over a private,
copy-on-write ``mmap``: no copy, pages read on first touch).

The key (SHA-256) and what it covers (GGUF bytes, octavo's code, torch, CPU flags, settings, ``OCTAVO_*``) are in
``weights_cache_key.py``.

What is restored must be all that loading changed. On the first load the cache records every module's
attributes (and those of the objects they hold: quantization methods, configs) before the weights stream in
and compares them afterwards; if anything other than parameters and buffers changed, or two tensors share
memory, or a tensor is not contiguous, nothing is cached (logged once) and every start loads normally.
File: ``MAGIC``, header length, JSON header, tensors at 64-byte offsets; a bad magic/header/key/size/CRC-32 is
logged, ignored and rewritten by the normal load. ``OCTAVO_WEIGHTS_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import tempfile
import threading
import zlib
from typing import Any

from octavo.core.loader.weights_cache_contract import _attr_state, _changed, snapshot  # noqa: F401 - snapshot: public
from octavo.core.loader.weights_cache_key import (  # noqa: F401 - the public names of the cache live here too
    FORMAT,
    CacheMiss,
    cache_key,
    cache_path,
    enabled,
    file_digest,
    key_for,
    prefetch_digest,
    prefetch_for_model,
)

logger = logging.getLogger(__name__)

MAGIC = b"OCTWC\x00\x01\n"
ALIGN = 64
KEEP_ENTRIES = 4  # newest cache files kept in the folder (each edit of octavo's code makes a new key)
_warned: set[str] = set()


# ------------------------------------------------------------------------------------------ save / restore

def _layout(model: Any) -> tuple[list, dict]:
    """``(unique tensors, {module: {"p": [[name, index, requires_grad] | [name, None]], "b": [[name, index,
    persistent]]}})``; raises ``CacheMiss`` for tensors the file cannot hold faithfully."""
    import torch

    tensors: list = []
    index: dict[int, int] = {}
    storages: dict[int, int] = {}
    modules: dict = {}

    def add(t: torch.Tensor, where: str) -> int:
        if id(t) in index:
            return index[id(t)]
        if t.device.type != "cpu" or not t.is_contiguous() or t.is_quantized or t.layout != torch.strided:
            raise CacheMiss(f"{where} is not a contiguous dense CPU tensor")
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr in storages:
                raise CacheMiss(f"{where} shares memory with another tensor")
            storages[ptr] = len(tensors)
        index[id(t)] = len(tensors)
        tensors.append(t.detach())
        return index[id(t)]

    for name, module in model.named_modules():
        params = [[p, None] if t is None else [p, add(t, f"{name}.{p}"), bool(t.requires_grad)]
                  for p, t in module._parameters.items()]
        bufs = [[b, add(t, f"{name}.{b}"), b not in module._non_persistent_buffers_set]
                for b, t in module._buffers.items() if t is not None]
        if any(t is None for t in module._buffers.values()):
            raise CacheMiss(f"{name} has a buffer set to None")
        if params or bufs:
            modules[name] = {"p": params, "b": bufs}
    return tensors, modules


def save(model: Any, key: str, before: dict) -> str | None:
    """Write the processed ``model`` under ``key`` if loading changed nothing but tensors; returns the path, or
    None (the reason is logged once)."""
    import torch

    reason = _changed(before, _attr_state(model))
    try:
        if reason is not None:
            raise CacheMiss(f"loading changed {reason}")
        tensors, modules = _layout(model)
    except CacheMiss as e:
        _warn_once(f"weights cache: not caching {type(model).__name__}: {e}")
        return None
    entries, offset = [], 0
    for t in tensors:
        offset = _align(offset)
        nbytes = t.numel() * t.element_size()
        entries.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset,
                        "nbytes": nbytes})
        offset += nbytes
    data_size = offset
    path = cache_path(key)
    folder = os.path.dirname(path)
    header_obj = {"format": FORMAT, "key": key, "tensors": entries, "modules": modules, "data_size": data_size,
                  "crc32": f"{0:08x}"}  # fixed width: filling in the CRC keeps the header's length
    n = len(json.dumps(header_obj).encode())
    body_start = _align(16 + n)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        try:
            with os.fdopen(fd, "wb+") as f:
                f.truncate(body_start + data_size)
                for t, entry in zip(tensors, entries):
                    if entry["nbytes"]:
                        f.seek(body_start + entry["offset"])
                        f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                f.flush()
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    view = memoryview(mm)
                    header_obj["crc32"] = f"{zlib.crc32(view[body_start:]):08x}"
                    view.release()
                header = json.dumps(header_obj).encode()
                assert len(header) == n
                f.seek(0)
                f.write(MAGIC + struct.pack("<Q", n) + header)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _prune(folder, keep=path)
    except OSError as e:
        _warn_once(f"weights cache: could not write {path} ({e}); the model loads from the GGUF each time. Set "
                   "OCTAVO_CACHE_DIR to a writable folder, or OCTAVO_WEIGHTS_CACHE=0.")
        return None
    logger.info("weights cache: wrote %s (%.0f MB)", path, data_size / 1e6)
    return path


def _prune(folder: str, keep: str) -> None:
    """Keep the newest ``KEEP_ENTRIES`` cache files (a code edit or a new setting makes a new key)."""
    files = []
    for name in os.listdir(folder):
        p = os.path.join(folder, name)
        if name.endswith(".bin") and p != keep:
            try:
                files.append((os.stat(p).st_mtime, p))
            except OSError:
                pass
    for _, p in sorted(files, reverse=True)[KEEP_ENTRIES - 1:]:
        try:
            os.unlink(p)
        except OSError:
            pass


def _read(path: str, key: str) -> tuple[dict, mmap.mmap, int]:
    """Open and check a cache file: ``(header, map, data start)``; raises ``CacheMiss`` when it is unusable."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CacheMiss("no cache file yet") from None
    except OSError as e:
        raise CacheMiss(f"cannot open {path}: {e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            raise CacheMiss(f"{path} is not a weights cache file (bad magic)")
        (n,) = struct.unpack("<Q", head[8:])
        if n > size:
            raise CacheMiss(f"{path}: header length {n} beyond the file's {size} bytes")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise CacheMiss(f"{path}: damaged header ({e})") from None
        if header.get("format") != FORMAT or header.get("key") != key:
            raise CacheMiss(f"{path}: written for another key or format")
        body_start = _align(16 + n)
        if size != body_start + header.get("data_size", -1):
            raise CacheMiss(f"{path}: size {size} does not match its header (truncated?)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mm)
    crc = f"{zlib.crc32(view[body_start:]):08x}"
    view.release()
    if crc != header["crc32"]:
        mm.close()
        raise CacheMiss(f"{path}: data does not match its CRC-32 (damaged)")
    return header, mm, body_start


def _align(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


class PendingRead:
    """``_read`` of a key's file on a thread (its CRC pass drops the GIL) while the caller builds the model."""

    def __init__(self, key: str):
        self.key, self._out = key, []
        self._thread = threading.Thread(target=self._run, name="octavo-weights-cache", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out.append(_read(cache_path(self.key), self.key))
        except CacheMiss as e:
            self._out.append(e)
        except Exception as e:  # noqa: BLE001 - any failure to read the cache is a miss, with its reason
            self._out.append(CacheMiss(f"cannot read {cache_path(self.key)}: {type(e).__name__}: {e}"))

    def result(self) -> tuple[dict, mmap.mmap, int]:
        self._thread.join()
        if isinstance(self._out[0], CacheMiss):
            raise self._out[0]
        return self._out[0]


def restore(model: Any, key: str, pending: PendingRead | None = None) -> str:
    """Replace the freshly built ``model``'s parameters and buffers with the cached ones (``model`` as built
    by ``load_model`` before any weight streamed in). Returns the file's path; raises ``CacheMiss``."""
    import torch

    path = cache_path(key)
    header, mm, body_start = pending.result() if pending is not None else _read(path, key)
    tensors = []
    for entry in header["tensors"]:
        dtype = getattr(torch, entry["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise CacheMiss(f"{path}: unknown dtype {entry['dtype']}")
        shape = tuple(entry["shape"])
        count = 1
        for d in shape:
            count *= d
        if count * dtype.itemsize != entry["nbytes"]:
            raise CacheMiss(f"{path}: tensor sizes do not match their shapes")
        tensors.append(torch.empty(shape, dtype=dtype) if count == 0 else
                       torch.frombuffer(mm, dtype=dtype, count=count, offset=body_start + entry["offset"]).view(shape))
    saved = header["modules"]
    names = {name for name, _ in model.named_modules()}
    if not set(saved) <= names:
        raise CacheMiss(f"{path}: modules {sorted(set(saved) - names)[:3]} are not in the model")
    owner: dict[int, Any] = {}  # cached tensor index -> the model's parameter object that takes it (ties)
    plan = []
    for name, module in model.named_modules():
        entry = saved.get(name, {"p": [], "b": []})
        params = {}
        for item in entry["p"]:
            pname, idx = item[0], item[1]
            if idx is None:
                params[pname] = None
                continue
            old = module._parameters.get(pname)
            if old is not None:
                if owner.setdefault(idx, old) is not old:
                    raise CacheMiss(f"{path}: {name}.{pname} is tied differently in the built model")
            params[pname] = (old, idx, item[2])
        plan.append((module, params, entry["b"]))
    seen: dict[int, int] = {}
    for _module, params, _ in plan:
        for value in params.values():
            if value is not None and value[0] is not None:
                if seen.setdefault(id(value[0]), value[1]) != value[1]:
                    raise CacheMiss(f"{path}: a parameter of the built model maps to two cached tensors")
    made: dict[int, Any] = {}
    for module, params, bufs in plan:
        new_params = {}
        for pname, value in params.items():
            if value is None:
                new_params[pname] = None
                continue
            old, idx, requires_grad = value
            if old is not None:
                old.data = tensors[idx]
                old.requires_grad_(requires_grad)
                new_params[pname] = old
            else:
                if idx not in made:
                    made[idx] = torch.nn.Parameter(tensors[idx], requires_grad=requires_grad)
                new_params[pname] = made[idx]
        module._parameters.clear()
        module._parameters.update(new_params)
        module._buffers.clear()
        module._non_persistent_buffers_set.clear()
        for bname, idx, persistent in bufs:
            module._buffers[bname] = tensors[idx]
            if not persistent:
                module._non_persistent_buffers_set.add(bname)
    return path


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def try_restore(model: Any, key: str, source: str, pending: PendingRead | None = None) -> bool:
    """``restore`` that logs instead of raising: True when the model now holds the cached weights."""
    try:
        path = restore(model, key, pending)
    except CacheMiss as e:
        (logger.info if str(e) == "no cache file yet" else logger.warning)(
            "weights cache: %s; loading %s and caching it", e, source)
        return False
    logger.info("weights cache: %s loaded from %s", source, path)
    return True
