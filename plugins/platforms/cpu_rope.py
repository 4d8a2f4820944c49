"""Rotary embedding on a CPU in one C pass, the same bits as ``octavo.nn.RotaryEmbedding`` (issue 18, offline).

Why: the module's torch form widens q and k to float32, splits the halves, runs four multiplies, a subtract, an
add, a concatenation and a rounding copy: ~10 ops per layer, each a pass over the step's q/k. In a 2,048-token
bf16 prefill step (1 thread) those were ~15 % of the step (profile in docs/performance.md "Offline 64 x 128/128,
session 7"); at batch 64 decode they are ~10 dispatches per layer. This kernel reads q and k where they lie (rows
of the fused QKV output), and per element computes exactly the module's float32 operations in the module's
order, compiled with ``-ffp-contract=off`` (no fused multiply-add): ``o1 = x1 * cos - x2 * sin``,
``o2 = x2 * cos + x1 * sin``, rounded to bfloat16 to nearest even as ``Tensor.to`` does. So the output is the
module's bit for bit (checked at install on random inputs, and by tests/unit/test_cpu_rope.py).

Installed by the CPU platform's ``prepare_model`` on neox-style modules rotating the whole head; a call with
another dtype or device runs the module's own forward. ``OCTAVO_CPU_FUSED_ROPE=0`` keeps the torch form.
"""

from __future__ import annotations

import ctypes
import logging
import types

import torch

from octavo.env_flags import env_switch
from octavo.plugins.quant.cpu_build import cached_library

logger = logging.getLogger(__name__)

C_SOURCE = r"""
#include <stdint.h>

static inline float bf(uint16_t v) { union { uint32_t u; float f; } c; c.u = (uint32_t)v << 16; return c.f; }
static inline uint16_t to_bf(float f) {
    union { float f; uint32_t u; } c; c.f = f;
    if (f != f) return 0xFFFF;  /* NaN: what torch's vectorized conversion writes */
    return (uint16_t)((c.u + 0x7FFFu + ((c.u >> 16) & 1u)) >> 16);
}

/* heads h of row i: x = src + i * sstride + h * d (bf16 or f32), out = dst + (i * nh + h) * d */
static inline void rot_rows(const void* src, long sstride, void* dst, int nh, int d, int bf16, const float* c,
                            const float* s, long i) {
    int half = d / 2;
    for (int h = 0; h < nh; h++) {
        long in = i * sstride + (long)h * d, out = (i * nh + h) * (long)d;
        if (bf16) {
            const uint16_t* x = (const uint16_t*)src + in;
            uint16_t* o = (uint16_t*)dst + out;
            #pragma omp simd
            for (int j = 0; j < half; j++) {
                float x1 = bf(x[j]), x2 = bf(x[j + half]);
                float a = x1 * c[j], b = x2 * s[j], e = x2 * c[j], f = x1 * s[j];
                o[j] = to_bf(a - b);
                o[j + half] = to_bf(e + f);
            }
        } else {
            const float* x = (const float*)src + in;
            float* o = (float*)dst + out;
            #pragma omp simd
            for (int j = 0; j < half; j++) {
                float x1 = x[j], x2 = x[j + half];
                float a = x1 * c[j], b = x2 * s[j], e = x2 * c[j], f = x1 * s[j];
                o[j] = a - b;
                o[j + half] = e + f;
            }
        }
    }
}

/* q rows [n] of nq heads (qstride elements apart), k rows of nk heads -> contiguous qo, ko; cos/sin [*, d/2] at
   positions[i]. Returns the number of positions outside [0, npos) (nothing written then). */
long rope_neox(const void* q, long qstride, int nq, const void* k, long kstride, int nk, int d, int bf16,
               const float* cos_t, const float* sin_t, long npos, const int64_t* positions, long n, void* qo,
               void* ko, int nthreads) {
    long bad = 0;
    for (long i = 0; i < n; i++) bad += positions[i] < 0 || positions[i] >= npos;
    if (bad) return bad;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && n >= 256)
    for (long i = 0; i < n; i++) {
        const float* c = cos_t + positions[i] * (d / 2);
        const float* s = sin_t + positions[i] * (d / 2);
        rot_rows(q, qstride, qo, nq, d, bf16, c, s, i);
        rot_rows(k, kstride, ko, nk, d, bf16, c, s, i);
    }
    return 0;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing", "-shared", "-fPIC"]
_state: dict[str, object] = {}
SWITCH = "OCTAVO_CPU_FUSED_ROPE"


def library() -> ctypes.CDLL | None:
    p, i, lg = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    return cached_library(_state, C_SOURCE, "octavo_cpu_rope", _FLAGS,
                          {"rope_neox": ([p, lg, i, p, lg, i, i, i, p, p, lg, p, lg, p, p, i], lg)}, switch=SWITCH)


def _rows_ok(x: torch.Tensor, d: int) -> bool:
    return x.dim() == 2 and x.stride(1) == 1 and x.shape[1] % d == 0


def rope_forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
    """``RotaryEmbedding.forward`` through the C kernel when it applies, else the module's own forward."""
    d = self.head_size
    if (torch.compiler.is_compiling()  # a graph traced over this module (ctypes would break it): torch's ops
            or query.dtype not in (torch.bfloat16, torch.float32) or key.dtype != query.dtype
            or query.device.type != "cpu" or positions.dtype != torch.int64 or not positions.is_contiguous()
            or not (_rows_ok(query, d) and _rows_ok(key, d)) or self.cos_cache.dtype != torch.float32
            or not self.cos_cache.is_contiguous() or not self.sin_cache.is_contiguous()):
        return type(self).forward(self, positions, query, key)
    n = query.shape[0]
    qo, ko = torch.empty(query.shape, dtype=query.dtype), torch.empty(key.shape, dtype=key.dtype)
    bad = library().rope_neox(query.data_ptr(), query.stride(0), query.shape[1] // d, key.data_ptr(), key.stride(0),
                              key.shape[1] // d, d, int(query.dtype == torch.bfloat16), self.cos_cache.data_ptr(),
                              self.sin_cache.data_ptr(), self.cos_cache.shape[0], positions.data_ptr(), n,
                              qo.data_ptr(), ko.data_ptr(), torch.get_num_threads())
    if bad:
        raise IndexError(f"rotary: {bad} position(s) beyond the table's {self.cos_cache.shape[0]}")
    return qo, ko


def _applies(module) -> bool:
    return (module.is_neox_style and module.rotary_dim == module.head_size and module.head_size % 2 == 0
            and module.cos_cache.device.type == "cpu")


@torch.inference_mode()
def _same_bits(module, dtype: torch.dtype) -> bool:
    g = torch.Generator().manual_seed(0)
    d, n = module.head_size, 19
    qkv = (torch.randn(n, 7 * d, generator=g) * 3).to(dtype)
    q, k = qkv[:, : 4 * d], qkv[:, 4 * d: 6 * d]
    pos = torch.randint(0, module.cos_cache.shape[0], (n,), generator=g)
    want = type(module).forward(module, pos, q, k)
    got = rope_forward(module, pos, q, k)
    return all(torch.equal(a, b) for a, b in zip(got, want))


def install_rope(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Install :func:`rope_forward` on ``model``'s rotary modules where it applies and gives the module's bits;
    returns how many. 0 when ``OCTAVO_CPU_FUSED_ROPE=0`` or the kernel cannot be built (logged)."""
    from octavo.nn.rotary import RotaryEmbedding

    if not env_switch(SWITCH) or dtype not in (torch.bfloat16, torch.float32):
        return 0
    mods = [m for m in model.modules() if type(m) is RotaryEmbedding and _applies(m)]
    if not mods:
        return 0
    if library() is None:
        logger.info("rotary stays in torch ops: %s", _state.get("why"))
        return 0
    checked: dict[tuple, bool] = {}
    count = 0
    for m in mods:
        key = (m.head_size, m.cos_cache.data_ptr())
        if key not in checked:
            checked[key] = _same_bits(m, dtype)
            if not checked[key]:
                logger.warning("rotary kernel not used for head size %d: it differs from the module's forward",
                               m.head_size)
        if checked[key]:
            m.forward = types.MethodType(rope_forward, m)
            count += 1
    return count
