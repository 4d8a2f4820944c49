"""Many-row products of CPU int4/int8 weights: a dense copy of the weight, made once and kept, and one GEMM.

Why: ``cpu_kernel``'s fused kernels read the packed weight once per row group, which pays for few rows
(decode of a few requests); past ``FUSED_MAX_ROWS`` it used to dequantize the whole weight to float32 on every
call and run an fp32 GEMM. At decode batch 32-64 (``octavo serve`` at C=32, offline batches) that is every
step: SmolLM2's 30 layers + head wrote ~540 MB of fp32 weights per step, and an fp32 GEMM at 64 rows ran
~4x slower than the bf16 one on an AMX CPU (docs/performance.md). Here the dequantized weight is kept:

- a **float32** copy, whatever the activation dtype: exactly the values and the GEMM of the per-call path before.
  A bf16 copy (AMX GEMM, ~2x faster at 64 rows) was tried and taken out: it rounds the 4-bit weights to bf16 only
  for steps of more than 16 rows, so a request's greedy output changed with how many others shared its step
  (the server's 64-stream and colliding-id tests caught it); a request's tokens must not depend on the load;
- int8 weights (the GGUF's Q8_0 head) always keep a float32 copy: exact, as before (a bf16 copy would add
  more error than their 8 bits have).

Since session 5 the GGUF layers do not come here by default (their int8-activation kernel runs every row count, so a
row's result does not depend on the batch: docs/quantization.md); the other formats (GPTQ, AWQ, compressed-tensors,
online int4/int8) and ``OCTAVO_CPU_INT8_ACT=0`` do.

Copies are made on a weight's first many-row call and held while the packed weight lives (weak reference),
within :data:`MAX_BYTES` for the process; past it, a weight keeps the per-call dequantization (returns None).
"""

from __future__ import annotations

import threading
import weakref

import torch

#: total bytes of dense copies per process (SmolLM2-135M: 270 MB in bf16, 540 MB in fp32). Larger models keep
#: the per-call path for the layers past it: the cache trades memory for speed only while memory is small.
MAX_BYTES = 1 << 30
_lock = threading.Lock()
_cache: dict[tuple[int, torch.dtype], tuple[weakref.ref, torch.Tensor]] = {}
_used = [0]


def _dense(packed: torch.Tensor, dtype: torch.dtype, k: int, build) -> torch.Tensor | None:
    key = (id(packed), dtype)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0]() is packed:
            return hit[1]
        # freed weights drop their copies (a stale entry under this key too: its id was reused)
        for dead in [key_ for key_, (ref, _) in _cache.items() if ref() is None or key_ == key]:
            _used[0] -= _cache.pop(dead)[1].nbytes
        size = packed.shape[0] * k * dtype.itemsize
        if _used[0] + size > MAX_BYTES:
            return None
        dense = build().to(dtype)
        _cache[key] = (weakref.ref(packed), dense)
        _used[0] += dense.nbytes
        return dense


def _activation_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 always: the rows <= 16 kernels compute in float32 from the exact dequantized weight (see above)."""
    return torch.float32


def int4_rows(x: torch.Tensor, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor, dequant) -> torch.Tensor | None:
    """``x [m, K]`` times the int4 weight as float32 ``[m, N]`` through a kept dense copy; None past the budget.
    ``dequant() -> float32 [N, K]`` is cpu_kernel's own dequantization (the per-call path's values)."""
    dtype = _activation_dtype(x)
    w = _dense(w4, dtype, 2 * w4.shape[1], dequant)
    if w is None:
        return None
    return torch.nn.functional.linear(x.to(dtype), w).float()


def int8_rows(x: torch.Tensor, w8: torch.Tensor, dequant) -> torch.Tensor | None:
    """:func:`int4_rows` for int8 weights (a scale per group of 32), always with a float32 copy: int8 weights are
    precise enough (Q8_0 heads) that a bf16 rounding would be the larger error, so this path stays exact."""
    dtype = torch.float32
    w = _dense(w8, dtype, w8.shape[1], dequant)
    if w is None:
        return None
    return torch.nn.functional.linear(x.to(dtype), w).float()


def cached_bytes() -> int:
    """Bytes held by live dense copies (tests, notes)."""
    with _lock:
        return sum(d.nbytes for ref, d in _cache.values() if ref() is not None)
