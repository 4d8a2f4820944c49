"""RMSNorm (+ residual add) on a CPU in one C pass per row, the SAME arithmetic as the fused batch-1 stack.

Why: the fused batch-1 decode (:mod:`.cpu_fused_decode`) runs the whole decoder stack in C; for it to be the
default, a request decoding alone must compute the same bits as the same request batched with others (the
int8-activation path's batch invariance) and as a later prefill of the same tokens (prefix-cache invariance).
Torch's ``F.rms_norm`` reduces in an order that depends on its vectorization, which a per-row C loop cannot
copy; so this module replaces the norm of the per-op path (every batch size, prefill too) by :data:`ROW_C`,
the very text the fused stack compiles. Per row (row-independent, so batch invariant): the mean square in
double in index order, ``inv = (float)(1 / sqrt(ms + eps))``, then ``x * inv * w`` in float32 (float32
models) or ``bf16(bf16(x * inv) * w)`` (bfloat16 models: ``RMSNorm._norm``'s rounding points: normalise in
float32, round, scale in bfloat16). With a residual: ``r = x + residual`` rounded to the dtype first.

Installed by the CPU platform's ``prepare_model`` on every ``RMSNorm`` whose weight is float32/bfloat16 (not
with ``OCTAVO_CPU_COMPILE=1``); ``OCTAVO_CPU_C_NORM=0`` keeps torch's. Inputs it does not cover (another dtype,
a weight dtype unlike the input's, non-contiguous rows) run the module's forward. It equals torch's norm to
float32 rounding, not bit for bit (tests/quant/test_cpu_norm.py).
"""

from __future__ import annotations

import ctypes
import types

import torch

from octavo.env_flags import env_switch
from octavo.plugins.quant.cpu_build import cached_library

#: one row; included verbatim by cpu_fused_decode_src (md_bf16: the model dtype is bfloat16)
ROW_C = r"""
static inline float nb_bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t nb_f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* value rounded to the model dtype (bfloat16 when md_bf16) */
static inline float nb_rd(float f, int md_bf16) { return md_bf16 ? nb_bf2f(nb_f2bf(f)) : f; }
/* out = norm(x) * w of one row of n (x already in the model dtype's values) */
static void norm_row(const float* x, const void* w, int md_bf16, long n, double eps, float* out) {
    double ss = 0.0;
    for (long i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
    if (md_bf16) {
        for (long i = 0; i < n; i++) out[i] = nb_rd(nb_rd(x[i] * inv, 1) * nb_bf2f(((const uint16_t*)w)[i]), 1);
    } else {
        for (long i = 0; i < n; i++) out[i] = x[i] * inv * ((const float*)w)[i];
    }
}
"""

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
""" + ROW_C + r"""
#if defined(__AVX512F__)
/* nb_f2bf on 16 lanes (the bf16 bits in each dword's low half): integer round to nearest even, NaN -> quiet */
static inline __m512i nb_f2bf_v(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rnd = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(rnd, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}
static inline __m512 nb_rd_v(__m512 f) { return _mm512_castsi512_ps(_mm512_slli_epi32(nb_f2bf_v(f), 16)); }
static inline __m512 nb_ld_v(const void* p, long off, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float*)p + off);
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)((const uint16_t*)p + off)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline void nb_st_v(void* p, long off, int bf16, __m512 v) {
    if (bf16) _mm256_storeu_si256((__m256i*)((uint16_t*)p + off), _mm512_cvtepi32_epi16(nb_f2bf_v(v)));
    else _mm512_storeu_ps((float*)p + off, v);
}
#define NB_VEC(n) ((n) % 16 == 0)
#else
#define NB_VEC(n) 0
#endif
/* norm_row's second half: out = x * inv * w (the same operations in the same order, so the same bits) */
static void norm_apply(const float* x, const void* w, int md_bf16, long n, float inv, float* out) {
#if defined(__AVX512F__)
    if (NB_VEC(n)) {
        const __m512 vi = _mm512_set1_ps(inv);
        for (long i = 0; i < n; i += 16) {
            __m512 wv = nb_ld_v(w, i, md_bf16), xv = _mm512_loadu_ps(x + i);
            _mm512_storeu_ps(out + i, md_bf16 ? nb_rd_v(_mm512_mul_ps(nb_rd_v(_mm512_mul_ps(xv, vi)), wv))
                                              : _mm512_mul_ps(_mm512_mul_ps(xv, vi), wv));
        }
        return;
    }
#endif
    if (md_bf16) {
        for (long i = 0; i < n; i++) out[i] = nb_rd(nb_rd(x[i] * inv, 1) * nb_bf2f(((const uint16_t*)w)[i]), 1);
    } else {
        for (long i = 0; i < n; i++) out[i] = x[i] * inv * ((const float*)w)[i];
    }
}
/* row i of x (+ residual, rounded to the dtype) as float -> r */
static inline void load_row(const void* x, const void* res, long i, long n, int bf16, float* r) {
#if defined(__AVX512F__)
    if (NB_VEC(n)) {
        for (long j = 0; j < n; j += 16) {
            __m512 v = nb_ld_v(x, i * n + j, bf16);
            if (res) {
                v = _mm512_add_ps(v, nb_ld_v(res, i * n + j, bf16));
                if (bf16) v = nb_rd_v(v);
            }
            _mm512_storeu_ps(r + j, v);
        }
        return;
    }
#endif
    for (long j = 0; j < n; j++) {
        float v = bf16 ? nb_bf2f(((const uint16_t*)x)[i * n + j]) : ((const float*)x)[i * n + j];
        if (res) v = nb_rd(v + (bf16 ? nb_bf2f(((const uint16_t*)res)[i * n + j]) : ((const float*)res)[i * n + j]), bf16);
        r[j] = v;
    }
}
static inline void store_row(const float* o, const float* r, const void* res, void* res_out, long i, long n, int bf16,
                             void* out) {
#if defined(__AVX512F__)
    if (NB_VEC(n)) {
        for (long j = 0; j < n; j += 16) {
            nb_st_v(out, i * n + j, bf16, _mm512_loadu_ps(o + j));
            if (res) nb_st_v(res_out, i * n + j, bf16, _mm512_loadu_ps(r + j));
        }
        return;
    }
#endif
    for (long j = 0; j < n; j++) {
        if (bf16) {
            ((uint16_t*)out)[i * n + j] = nb_f2bf(o[j]);
            if (res) ((uint16_t*)res_out)[i * n + j] = nb_f2bf(r[j]);
        } else {
            ((float*)out)[i * n + j] = o[j];
            if (res) ((float*)res_out)[i * n + j] = r[j];
        }
    }
}
#define NB_GROUP 8
/* rows of x (and residual: then r = x + residual, written to res_out) -> out; bf16: all tensors bfloat16.
   Groups of 8 rows: each row's sum of squares is norm_row's (double, index order) with the 8 rows in the 8
   lanes of one AVX-512 register (one add chain per row, as in norm_row, but 8 chains at once: the scalar loop
   waits on the add latency), then norm_row's inv and scaling per row; the other rows run norm_row. Same bits
   for a row alone or in any group (tests/quant/test_cpu_norm.py). */
int rms_rows(const void* x, const void* res, void* res_out, const void* w, long rows, long n, int bf16, double eps,
             void* out, int nthreads) {
    int bad = 0;
#if defined(__AVX512F__)
    long groups = rows / NB_GROUP;
#else
    long groups = 0;
#endif
    long ntask = groups + (rows - groups * NB_GROUP);
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && rows >= 16) reduction(|:bad)
    for (long k = 0; k < ntask; k++) {
        long g = k < groups ? NB_GROUP : 1, i0 = k < groups ? k * NB_GROUP : groups * NB_GROUP + (k - groups);
        float* buf = (float*)malloc(sizeof(float) * (size_t)((2 * g + g) * n));
        if (!buf) { bad = 1; continue; }
        float *r = buf, *o = buf + g * n, *rt = buf + 2 * g * n;
        for (long a = 0; a < g; a++) load_row(x, res, i0 + a, n, bf16, r + a * n);
        if (g == 1) {
            norm_row(r, w, bf16, n, eps, o);
        } else {
#if defined(__AVX512F__)
            for (long a = 0; a < NB_GROUP; a++)
                for (long j = 0; j < n; j++) rt[j * NB_GROUP + a] = r[a * n + j];
            __m512d ss = _mm512_setzero_pd();
            for (long j = 0; j < n; j++) {
                __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(rt + j * NB_GROUP));
                ss = _mm512_add_pd(ss, _mm512_mul_pd(v, v));
            }
            __m512d ms = _mm512_add_pd(_mm512_div_pd(ss, _mm512_set1_pd((double)n)), _mm512_set1_pd(eps));
            __m256 inv8 = _mm512_cvtpd_ps(_mm512_div_pd(_mm512_set1_pd(1.0), _mm512_sqrt_pd(ms)));
            float inv[NB_GROUP];
            _mm256_storeu_ps(inv, inv8);
            for (long a = 0; a < NB_GROUP; a++) norm_apply(r + a * n, w, bf16, n, inv[a], o + a * n);
#endif
        }
        for (long a = 0; a < g; a++) store_row(o + a * n, r + a * n, res, res_out, i0 + a, n, bf16, out);
        free(buf);
    }
    return bad;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing", "-shared", "-fPIC"]
_state: dict[str, object] = {}
SWITCH = "OCTAVO_CPU_C_NORM"


def library() -> ctypes.CDLL | None:
    p, lg, i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    return cached_library(_state, C_SOURCE, "octavo_cpu_norm", _FLAGS,
                          {"rms_rows": ([p, p, p, p, lg, lg, i, ctypes.c_double, p, i], i)}, switch=SWITCH)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``normed`` or ``(normed, x + residual)`` like ``RMSNorm.forward``; None when it does not apply."""
    dt = x.dtype
    if (dt not in (torch.float32, torch.bfloat16) or weight.dtype != dt or x.device.type != "cpu"
            or not x.is_contiguous() or not weight.is_contiguous() or x.shape[-1] != weight.shape[0]
            or (residual is not None and (residual.dtype != dt or residual.shape != x.shape
                                          or not residual.is_contiguous()))):
        return None
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=dt)
    res_out = torch.empty(x.shape, dtype=dt) if residual is not None else None
    if library().rms_rows(x.data_ptr(), residual.data_ptr() if residual is not None else None,
                          res_out.data_ptr() if res_out is not None else None, weight.data_ptr(), x.numel() // max(n, 1),
                          n, int(dt == torch.bfloat16), float(eps), out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("RMSNorm: out of memory for a row buffer")
    return out if residual is None else (out, res_out)


def norm_forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
    if torch.compiler.is_compiling():  # a graph traced over this module (ctypes would break it): torch's ops
        return type(self).forward(self, x, residual)
    got = rms_norm(x, self.weight, self.eps, residual)
    return got if got is not None else type(self).forward(self, x, residual)


def installed(module) -> bool:
    """Whether ``module`` (an RMSNorm) runs :func:`norm_forward`."""
    f = module.__dict__.get("forward")
    return getattr(f, "__func__", None) is norm_forward


def install_norm(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Install :func:`norm_forward` on ``model``'s ``RMSNorm`` modules of a float32/bfloat16 weight; returns how
    many (0: switched off or not buildable)."""
    from octavo.nn.layernorm import RMSNorm

    if not env_switch(SWITCH) or dtype not in (torch.bfloat16, torch.float32):
        return 0
    mods = [m for m in model.modules() if type(m) is RMSNorm and m.weight.dtype == dtype]
    if not mods or library() is None:
        return 0
    for m in mods:
        m.forward = types.MethodType(norm_forward, m)
    return len(mods)
