"""Greedy token choice on a CPU: ``argmax`` over float32 logits rows in one C pass (issue 18, offline batch 64).

Why: at batch 64 the all-greedy sampler's ``logits.argmax(dim=-1)`` over 64 x 49,152 float32 logits took
~6.4 ms of thread CPU per decode step (torch's CPU argmax reduction keeps a value and an index per element),
while reading those 12.6 MB once takes ~0.6 ms (``amax``). This is the CPU platform's answer to
``Platform.make_greedy_argmax``: per row the maximum by 16-lane compares with each lane keeping its first
index, then the lowest index among the lanes that hold the maximum, i.e. exactly ``torch.argmax``: the first
index of the largest value; a row with a NaN gives its first NaN's index (torch's argmax treats NaN as the
largest value); ``-0.0`` and ``0.0`` compare equal, so the first of them wins.

What it does not cover (another dtype, not 2-D, a row stride that is not contiguous, no compiler) runs
``torch.argmax``. ``OCTAVO_CPU_C_ARGMAX=0`` keeps torch's everywhere. Tested against ``torch.argmax`` with ties,
NaN, infinities and signed zeros by the platform contract (``PlatformContract.test_own_greedy_argmax_is_torch_argmax``,
run for this platform by tests/plugins/test_platform_cpu.py).
"""

from __future__ import annotations

import ctypes

import torch

from octavo.plugins.quant.cpu_build import cached_library

SWITCH = "OCTAVO_CPU_C_ARGMAX"

C_SOURCE = r"""
#include <stdint.h>
#include <float.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* first index of the largest value of x[0 .. n), NaN counting as the largest (its first index wins) */
static int64_t row_argmax(const float* x, int64_t n) {
    int64_t i = 0, best = 0;
#if defined(__AVX512F__)
    if (n >= 16) {
        __m512 bv = _mm512_loadu_ps(x);
        __m512i bi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), idx = bi;
        const __m512i step = _mm512_set1_epi32(16);
        __mmask16 nan = _mm512_cmp_ps_mask(bv, bv, _CMP_UNORD_Q);
        for (i = 16; i + 16 <= n && !nan; i += 16) {
            idx = _mm512_add_epi32(idx, step);
            __m512 v = _mm512_loadu_ps(x + i);
            nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            __mmask16 gt = _mm512_cmp_ps_mask(v, bv, _CMP_GT_OQ);  /* strictly greater: each lane keeps its first */
            bv = _mm512_mask_mov_ps(bv, gt, v);
            bi = _mm512_mask_mov_epi32(bi, gt, idx);
        }
        if (nan) {  /* a NaN in the vectors read so far: the first NaN of the row (a scalar scan from 0) */
            for (int64_t j = 0; j < n; j++) if (x[j] != x[j]) return j;
        }
        float m = _mm512_reduce_max_ps(bv);
        __mmask16 at = _mm512_cmp_ps_mask(bv, _mm512_set1_ps(m), _CMP_EQ_OQ);
        int32_t lanes[16];
        _mm512_storeu_si512((void*)lanes, bi);
        best = -1;
        for (int l = 0; l < 16; l++)
            if (((at >> l) & 1) && (best < 0 || lanes[l] < best)) best = lanes[l];
        /* the tail past the last whole vector, in order (strictly greater keeps the first) */
        float bm = x[best];
        for (; i < n; i++) {
            if (x[i] != x[i]) { for (int64_t j = 0; j < n; j++) if (x[j] != x[j]) return j; }
            if (x[i] > bm) { bm = x[i]; best = i; }
        }
        return best;
    }
#endif
    float bm = x[0];
    if (bm != bm) return 0;
    for (i = 1; i < n; i++) {
        if (x[i] != x[i]) return i;
        if (x[i] > bm) { bm = x[i]; best = i; }
    }
    return best;
}

void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t stride, int64_t* out, int nthreads) {
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && rows >= 8)
    for (int64_t r = 0; r < rows; r++) out[r] = row_argmax(x + r * stride, n);
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-strict-aliasing", "-shared", "-fPIC"]
_state: dict[str, object] = {}


def library() -> ctypes.CDLL | None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    return cached_library(_state, C_SOURCE, "octavo_cpu_argmax", _FLAGS,
                          {"argmax_rows": ([p, i64, i64, i64, p, ctypes.c_int], None)}, switch=SWITCH)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` (int64 ``[R]``) for float32 ``[R, V]`` CPU logits with unit column stride; any
    other input: ``torch.argmax`` itself."""
    lib = library()
    if (lib is None or logits.dtype != torch.float32 or logits.dim() != 2 or logits.device.type != "cpu"
            or logits.stride(1) != 1 or logits.shape[1] == 0 or logits.shape[1] >= 2**31):
        return logits.argmax(dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    lib.argmax_rows(logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0), out.data_ptr(),
                    torch.get_num_threads())
    return out
