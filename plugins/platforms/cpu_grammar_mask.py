"""The grammar bitmask applied to CPU logits straight from the packed words, in C: the CPU platform's answer to
``Platform.make_grammar_mask_apply`` (the core calls it through the platform, never by import).

Why: the core's numpy form (core/grammar_mask_cpu.py: ``x = (x & keep) | neg`` on the logits' bits) needs two
``[n, V]`` operands unpacked from the bits first. At batch 32 x 49152 that is ~2-3 ms of CPU on the bitmask
thread plus ~2 ms for the two in-place passes after the forward (session 6, quiet 2-vCPU VM: 6.8 ms of fill
thread + 2.0 ms of apply per 130 ms step), and on a 2-core machine the fill thread's time is taken from one of
torch's two threads. Here one pass reads the packed int32 words (bit ``t % 32`` of word ``t // 32`` allows token
``t``), skips a word of all ones (32 allowed tokens) and stores the ``-inf`` bits into the others' disallowed
slots with a branch-free select: no operands, no unpacking, one thread (no OpenMP barrier to stall under load).
The result is the numpy form's bit for bit (a disallowed slot gets exactly ``-inf``, an allowed one is untouched,
NaN and inf included).

Works on the bits, so one routine per element width serves fp32 (4 bytes), bf16/fp16 (2) and fp64 (8).
"""

from __future__ import annotations

import ctypes
import platform

import torch

from octavo.plugins.quant.cpu_build import cached_library

C_SOURCE = r"""
#include <stdint.h>

#define DEFINE_APPLY(NAME, T)                                                                         \
void NAME(T *logits, int64_t stride, const int32_t *packed, int64_t words, const int32_t *rows, int n,   \
          int64_t vocab, T neg) {                                                                     \
    for (int j = 0; j < n; ++j) {                                                                     \
        T *x = logits + (int64_t)(rows ? rows[j] : j) * stride;                                       \
        const uint32_t *w = (const uint32_t *)(packed + (int64_t)j * words);                          \
        int64_t full = vocab / 32;                                                                    \
        for (int64_t k = 0; k < full; ++k) {                                                          \
            uint32_t m = w[k];                                                                        \
            if (m == 0xFFFFFFFFu) continue;                                                           \
            T *y = x + 32 * k;                                                                        \
            if (m == 0) {                                                                             \
                for (int b = 0; b < 32; ++b) y[b] = neg;                                              \
                continue;                                                                             \
            }                                                                                         \
            for (int b = 0; b < 32; ++b) y[b] = ((m >> b) & 1u) ? y[b] : neg;                         \
        }                                                                                             \
        if (full < words) {                                                                           \
            uint32_t m = w[full];                                                                     \
            for (int64_t t = 32 * full; t < vocab; ++t)                                               \
                if (!((m >> (t - 32 * full)) & 1u)) x[t] = neg;                                       \
        }                                                                                             \
    }                                                                                                 \
}

DEFINE_APPLY(octavo_mask_apply_b16, uint16_t)
DEFINE_APPLY(octavo_mask_apply_b32, uint32_t)
DEFINE_APPLY(octavo_mask_apply_b64, uint64_t)
"""

_FLAGS = ["-O3", "-march=native", "-fno-strict-aliasing", "-shared", "-fPIC"] + (
    ["-mprefer-vector-width=512"] if platform.machine() in ("x86_64", "AMD64") else [])
_state: dict[str, object] = {}
_P, _I64, _I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# logits dtype -> (C routine, same-width int dtype the -inf bits are read as, ctypes type of those bits)
_ROUTINES = {torch.float32: ("octavo_mask_apply_b32", torch.int32, ctypes.c_uint32),
             torch.bfloat16: ("octavo_mask_apply_b16", torch.int16, ctypes.c_uint16),
             torch.float16: ("octavo_mask_apply_b16", torch.int16, ctypes.c_uint16),
             torch.float64: ("octavo_mask_apply_b64", torch.int64, ctypes.c_uint64)}
_NEG: dict[torch.dtype, int] = {}


def library() -> ctypes.CDLL | None:
    """The compiled routines, or None where they cannot be built (no C compiler; the reason:
    :func:`unavailable_reason`) or ``OCTAVO_CPU_GRAMMAR_MASK_C=0``: the core's numpy apply then runs."""
    sig = {name: ([_P, _I64, _P, _I64, _P, _I, _I64, ctype], None) for name, _, ctype in _ROUTINES.values()}
    return cached_library(_state, C_SOURCE, "octavo_grammar_mask", _FLAGS, sig, switch="OCTAVO_CPU_GRAMMAR_MASK_C")


def unavailable_reason() -> str | None:
    library()
    return _state.get("why")  # type: ignore[return-value]


def _neg_bits(dtype: torch.dtype) -> int:
    """``-inf`` of ``dtype`` as an unsigned integer of the same width."""
    bits = _NEG.get(dtype)
    if bits is None:
        width = torch.finfo(dtype).bits
        bits = _NEG[dtype] = torch.tensor(float("-inf"), dtype=dtype).view(_ROUTINES[dtype][1]).item() % (1 << width)
    return bits


def apply_bitmask_cpu_(logits: torch.Tensor, packed: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """``Platform.make_grammar_mask_apply``'s contract on CPU tensors: in place, ``logits[rows[j], t] = -inf``
    wherever bit ``t % 32`` of word ``t // 32`` of ``packed[j]`` is clear (``rows`` int32 [n], or None: packed row
    j is logits row j). A logits dtype the routines do not know raises ``TypeError`` (the core then applies
    its own way)."""
    if logits.dtype not in _ROUTINES:
        raise TypeError(f"CPU grammar mask: no routine for {logits.dtype}")
    if logits.dim() != 2 or logits.stride(-1) != 1 or packed.dtype != torch.int32 or not packed.is_contiguous():
        raise ValueError("CPU grammar mask: logits [R, V] with a contiguous last dim and contiguous int32 words")
    n, words = packed.shape
    if words * 32 < logits.shape[1]:
        raise ValueError(f"CPU grammar mask: {words} words cannot cover a vocabulary of {logits.shape[1]}")
    if rows is not None:
        rows = rows.to(torch.int32).contiguous()
        if n and (int(rows.min()) < 0 or int(rows.max()) >= logits.shape[0]):
            raise IndexError("CPU grammar mask: a row index is outside the logits")
    elif n > logits.shape[0]:
        raise IndexError(f"CPU grammar mask: {n} packed rows for {logits.shape[0]} logits rows")
    lib = library()
    if lib is None:
        raise RuntimeError(f"CPU grammar mask kernel unavailable: {unavailable_reason()}")
    name, _, ctype = _ROUTINES[logits.dtype]
    getattr(lib, name)(logits.data_ptr(), logits.stride(0), packed.data_ptr(), words,
                       rows.data_ptr() if rows is not None else None, n, logits.shape[1], ctype(_neg_bits(logits.dtype)))
    return logits
