"""Fused INT8 W8A8 CPU kernel for few rows (decode): quantize each activation row, int8 dot, rescale, one call.

Why: ``torch._int_mm`` (oneDNN) is exact and fast for many rows, but a decode step calls it with one row per
sequence, where its fixed cost and the ~10 torch ops of per-token quantization and rescaling around it cost
more than the product. This kernel does, per activation row ``i`` (``m <= 16``)::

    s_i = max(amax|x_i| / 127, 1e-10)      (dynamic, symmetric)   or the static per-tensor scale
    xq  = clamp(nearbyint(x_i / s_i))       the same fp32 division and round-half-even as the torch path
    y[i, n] = (sum_k xq[k] * wq[n, k]) * s_i * w_scale[n]

with AVX512-VNNI ``vpdpbusd`` (unsigned x signed bytes: ``xq + 128`` times the weight, minus ``128 * sum_k wq``
precomputed per row), or portable C where VNNI is not compiled in. Built like
:mod:`octavo.plugins.quant.cpu_kernel` (``$CC -O3 -march=native -fopenmp`` into ``$OCTAVO_CACHE_DIR/kernels``
on first use, ctypes); :func:`library` is None, with the reason, when no compiler is there, and callers then
use the torch path. Under ``torch.compile`` it is the custom op ``octavo::w8a8_linear``.
"""

from __future__ import annotations

import ctypes

import torch

from octavo.plugins.quant.cpu_build import cached_library

#: at most this many rows use the fused kernel; more rows go through torch._int_mm.
FUSED_MAX_ROWS = 16

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#define MAXK 65536
#define PAR_MIN (1L << 16)

/* quantize one row: returns its scale; q gets xq + 128 (unsigned) */
static float quant_row(const float* x, int k, float static_scale, int lo, uint8_t* q) {
    float s = static_scale;
    if (s <= 0.f) {
        float amax = 0.f;
        for (int j = 0; j < k; j++) { float a = fabsf(x[j]); amax = a > amax ? a : amax; }
        s = amax / 127.0f;
        if (s < 1e-10f) s = 1e-10f;
    }
    for (int j = 0; j < k; j++) {
        float v = nearbyintf(x[j] / s);
        v = v < (float)lo ? (float)lo : (v > 127.f ? 127.f : v);
        q[j] = (uint8_t)((int)v + 128);
    }
    return s;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
static int32_t dot_u8s8(const uint8_t* a, const int8_t* b, int k) {
    __m512i acc = _mm512_setzero_si512();
    int j = 0;
    for (; j + 64 <= k; j += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(a + j), _mm512_loadu_si512(b + j));
    if (j < k) {
        __mmask64 mk = (~0ULL) >> (64 - (k - j));
        acc = _mm512_dpbusd_epi32(acc, _mm512_maskz_loadu_epi8(mk, a + j), _mm512_maskz_loadu_epi8(mk, b + j));
    }
    return _mm512_reduce_add_epi32(acc);
}
#else
static int32_t dot_u8s8(const uint8_t* a, const int8_t* b, int k) {
    int32_t t = 0;
    #pragma omp simd reduction(+:t)
    for (int j = 0; j < k; j++) t += (int32_t)a[j] * (int32_t)b[j];
    return t;
}
#endif

/* y[m, n] = dequant(quant(x)) . (w * sw)^T ; wsum128[n] = 128 * sum_k w[n, k]; static_scale <= 0: dynamic */
int w8a8_gemm(const float* x, int m, int k, const int8_t* w, const float* sw, const int32_t* wsum128, int n,
              float static_scale, int lo, float* y, int nthreads) {
    if (m > 16 || k > MAXK) return -1;
    if (m == 0) return 0;
    uint8_t* q = (uint8_t*)malloc((size_t)m * k);
    if (!q) return -2;
    float s[16];
    for (int i = 0; i < m; i++) s[i] = quant_row(x + (long)i * k, k, static_scale, lo, q + (long)i * k);
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
    for (int r = 0; r < n; r++) {
        const int8_t* wr = w + (long)r * k;
        for (int i = 0; i < m; i++)
            y[(long)i * n + r] = (float)(dot_u8s8(q + (long)i * k, wr, k) - wsum128[r]) * (s[i] * sw[r]);
    }
    free(q);
    return 0;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {"w8a8_gemm": ([_P, _I, _I, _P, _P, _P, _I, ctypes.c_float, _I, _P, _I], _I)}
_state: dict[str, object] = {}


def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None (reason: :func:`unavailable_reason`); ``OCTAVO_CPU_QUANT_KERNEL=0`` disables it."""
    return cached_library(_state, C_SOURCE, "octavo_w8a8", _FLAGS, _SIGNATURES, switch="OCTAVO_CPU_QUANT_KERNEL")


def unavailable_reason() -> str | None:
    library()
    return _state.get("why")  # type: ignore[return-value]


def weight_sums_128(wq: torch.Tensor) -> torch.Tensor:
    """``128 * sum_k wq[n, k]`` as int32 ``[N]`` (the unsigned-activation correction of ``vpdpbusd``)."""
    return (wq.to(torch.int32).sum(1) * 128).to(torch.int32).contiguous()  # sum() promotes to int64


def w8a8_linear(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, wsum128: torch.Tensor,
                static_scale: float) -> torch.Tensor:
    """``x [m <= 16, K]`` -> float32 ``[m, N]``; ``static_scale <= 0`` quantizes each row dynamically (symmetric,
    [-127, 127]), else with that scale ([-128, 127])."""
    if torch.compiler.is_compiling():
        return _w8a8_op(x, wq, w_scale, wsum128, static_scale)
    return _w8a8_linear(x, wq, w_scale, wsum128, static_scale)


def _w8a8_linear(x, wq, w_scale, wsum128, static_scale):
    x = x.float().contiguous()
    (m, k), n = x.shape, wq.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    lo = -127 if static_scale <= 0 else -128
    rc = library().w8a8_gemm(x.data_ptr(), m, k, wq.data_ptr(), w_scale.data_ptr(), wsum128.data_ptr(), n,
                             float(static_scale), lo, y.data_ptr(), torch.get_num_threads())
    if rc:
        raise ValueError(f"w8a8 kernel: {m} rows x {k} inputs failed ({rc}; limits: 16 rows, 65536 inputs)")
    return y


@torch.library.custom_op("octavo::w8a8_linear", mutates_args=())
def _w8a8_op(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, wsum128: torch.Tensor,
             static_scale: float) -> torch.Tensor:
    return _w8a8_linear(x, wq, w_scale, wsum128, static_scale)


@_w8a8_op.register_fake
def _(x, wq, w_scale, wsum128, static_scale):
    return x.new_empty((x.shape[0], wq.shape[0]), dtype=torch.float32)
