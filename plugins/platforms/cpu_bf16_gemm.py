"""bfloat16 linears on AVX512-BF16 CPUs without AMX: a ``vdpbf16ps`` GEMM with oneDNN's bits (issue 18, offline).

Why: on such CPUs (this session's 2-vCPU AMD EPYC, Zen 4) oneDNN runs bf16 matmuls with ``vdpbf16ps`` (no AMX),
and the offline run is GEMM-bound there: a batch-64 decode step spent 98 of 158 ms (1 thread) in the linears and
the LM head, the prefill 8.6 of 11.0 s. This kernel computes each output as oneDNN's ``avx512_core_bf16`` path
does (``vdpbf16ps`` over the K pairs in order within each of oneDNN's K blocks of 512 or 1,024 elements, each
block from zero and added to the running float32 sum, rounded to bf16 to nearest even; the block size was found
by matching oneDNN's bits, :func:`k_block_pairs`), so its results are **the same bits** (checked at install against ``torch.ops.mkldnn._linear_pointwise``
on the model's own weights, per shape; a shape that differs keeps oneDNN), and it skips oneDNN's per-call
set-up: 1.04-1.13x at 64 and 2,048 rows, 1.1-1.5x at 7 rows (1 thread, SmolLM2 shapes, docs/performance.md
"Offline 64 x 128/128, session 9").

Weights are packed once as ``[N / 64][K / 2][64][2]`` (a 64-column panel's K pair is four contiguous zmm); a
6-row x 64-column tile keeps 24 accumulators in registers; threads split the (panel, 6-row block) tiles, so every output is
computed by one thread in one order: a row's result depends only on its own input row and on whether it is
alone (oneDNN's one-row K block; batches of 2 .. N rows and thread counts give the same bits, as oneDNN's). Used by ``cpu_packed_linear.py`` where the CPU has AVX512-BF16 and no
AMX (with AMX oneDNN's tile path is ~4x faster and sums in another order); ``OCTAVO_CPU_BF16_GEMM=0`` keeps
oneDNN everywhere.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from octavo.env_flags import env_switch
from octavo.plugins.quant.cpu_build import cached_library

logger = logging.getLogger(__name__)

SWITCH = "OCTAVO_CPU_BF16_GEMM"
PANEL = 64  # output columns per packed panel

C_SOURCE = r"""
#include <stdint.h>

/* 1 where this build's machine (-march=native) has AVX512-BF16 and no AMX: where this kernel is wanted */
int wanted_here(void) {
#if defined(__AVX512F__) && defined(__AVX512BF16__) && !defined(__AMX_BF16__)
    return 1;
#else
    return 0;
#endif
}
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

/* MR rows (a: uint32 pairs, rows lda pairs apart) x one 64-column panel b ([kp][64] pairs) -> c (bf16).
   The K pairs run in blocks of kb (oneDNN's K block, see k_block_pairs): each block's chain starts from zero
   and is then added to the running sum, as oneDNN adds its K blocks */
static inline __attribute__((always_inline)) void tile(const uint32_t* a, long lda, const uint32_t* b, long kp,
                                                       long kb, void* c, long ldc, const int MR, int f32) {
    __m512 acc[6][4];
    float tot[6][64] __attribute__((aligned(64)));
    for (long p0 = 0; p0 < kp; p0 += kb) {
        const long p1 = p0 + kb < kp ? p0 + kb : kp;
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
        for (long p = p0; p < p1; p++) {
            const __m512bh b0 = (__m512bh)_mm512_load_si512(b + p * 64), b1 = (__m512bh)_mm512_load_si512(b + p * 64 + 16);
            const __m512bh b2 = (__m512bh)_mm512_load_si512(b + p * 64 + 32), b3 = (__m512bh)_mm512_load_si512(b + p * 64 + 48);
            for (int r = 0; r < MR; r++) {
                const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * lda + p]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
                acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
                acc[r][3] = _mm512_dpbf16_ps(acc[r][3], av, b3);
            }
        }
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < 4; j++)
                _mm512_store_ps(tot[r] + 16 * j, p0 == 0 ? acc[r][j] : _mm512_add_ps(_mm512_load_ps(tot[r] + 16 * j), acc[r][j]));
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < 4; j++) {  /* vcvtneps2bf16: nearest even, as oneDNN's output conversion */
            const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(tot[r] + 16 * j));
            if (f32)  /* the rounded bf16 widened to float32 (exact, as Tensor.float()): 16 zero low bits */
                _mm512_storeu_si512((float*)c + r * ldc + j * 16, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            else
                _mm256_storeu_si256((__m256i*)((uint16_t*)c + r * ldc + j * 16), h);
        }
}
#define TILE_CASE(R) case R: tile(a32 + m0 * lda, lda, b, kp, kb, f32 ? (void*)((float*)c + m0 * ldc + nb * 64) \
                                  : (void*)((uint16_t*)c + m0 * ldc + nb * 64), ldc, R, f32); break;
#endif

/* w [n][k] bf16 -> wp [n / 64][k / 2][64][2]. Returns -1 on a build without AVX512-BF16 */
int pack_w(const uint16_t* w, long n, long k, uint16_t* wp) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    long kp = k / 2;
    for (long nb = 0; nb < n / 64; nb++)
        for (long p = 0; p < kp; p++)
            for (int col = 0; col < 64; col++) {
                const uint16_t* src = w + (nb * 64 + col) * k + 2 * p;
                uint16_t* dst = wp + ((nb * kp + p) * 64 + col) * 2;
                dst[0] = src[0];
                dst[1] = src[1];
            }
    return 0;
#else
    (void)w; (void)n; (void)k; (void)wp;
    return -1;
#endif
}

/* c [m][n] (rows ldc apart) = a [m][k] (rows lda elements apart, lda even) x w^T, w packed by pack_w; c is bf16,
   or with f32 float32 holding the same bf16 values (an LM head's logits: no separate widening pass) */
int gemm(const uint16_t* a, long lda, const uint16_t* wp, long m, long n, long k, long kb, void* c, long ldc,
         int nthreads, int f32) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    const long kp = k / 2, np = n / 64, mb = (m + 5) / 6;
    const uint32_t* a32 = (const uint32_t*)a;
    lda /= 2;
    /* (panel, 6-row block) items in panel-major order, cut into contiguous runs per thread: a thread keeps a panel
       hot across its row blocks, and 9 panels x 11 blocks (N = 576 at 64 rows) still split evenly on 2 threads */
    #pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads) if (nthreads > 1 && np * mb > 1)
    for (long nb = 0; nb < np; nb++)
        for (long bi = 0; bi < mb; bi++) {
            const uint32_t* b = (const uint32_t*)(wp + nb * kp * 128);
            const long m0 = bi * 6;
            switch (m - m0 < 6 ? m - m0 : 6) {
                TILE_CASE(6) TILE_CASE(5) TILE_CASE(4) TILE_CASE(3) TILE_CASE(2) TILE_CASE(1)
                default: break;
            }
        }
    return 0;
#else
    (void)a; (void)lda; (void)wp; (void)m; (void)n; (void)k; (void)kb; (void)c; (void)ldc; (void)nthreads; (void)f32;
    return -1;
#endif
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-strict-aliasing", "-shared", "-fPIC"]
_state: dict[str, object] = {}


def library() -> ctypes.CDLL | None:
    p, lg, i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    return cached_library(_state, C_SOURCE, "octavo_cpu_bf16_gemm", _FLAGS,
                          {"wanted_here": ([], i), "pack_w": ([p, lg, lg, p], i), "gemm": ([p, lg, p, lg, lg, lg, lg, p, lg, i, i], i)}, switch=SWITCH)


def wanted() -> bool:
    """On by default where the CPU has AVX512-BF16 and no AMX, as the compiler sees it with ``-march=native``
    (``OCTAVO_CPU_BF16_GEMM=0``: off; False where the kernel cannot be built)."""
    return env_switch(SWITCH) and library() is not None and bool(library().wanted_here())


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight [N, K]`` bf16 packed for :func:`linear`, or None when the shape or the build does not allow it."""
    n, k = weight.shape
    if n % PANEL or k % 2 or weight.dtype != torch.bfloat16 or library() is None:
        return None
    w = weight.detach().contiguous()
    wp = torch.empty(n * k, dtype=torch.bfloat16)
    if library().pack_w(w.data_ptr(), n, k, wp.data_ptr()):
        return None
    return wp.view(n // PANEL, k // 2, PANEL * 2)


def k_block_pairs(k: int, m: int) -> int:
    """oneDNN's K block (in bf16 pairs) for ``m`` rows of a reduction of ``k``, found by matching its bits (oneDNN
    3.12, AVX512-BF16, K = 64 .. 14,336, M = 1 .. 2,048): 512 elements for one row or K <= 1,024, else 1,024 (so
    oneDNN's own one-row result differs from the same row in a batch when K > 1,024; this keeps that too). The
    install check (:func:`same_bits_as_onednn`) catches another version's choice."""
    return 256 if k <= 1024 or m == 1 else 512


def linear(x: torch.Tensor, wp: torch.Tensor, out_f32: bool = False) -> torch.Tensor | None:
    """``x [..., K] @ W^T`` in bf16 from the packed ``wp``; None when ``x``'s layout does not allow it (rows must
    be 4-byte aligned pairs: unit inner stride, even row stride). ``out_f32``: float32 holding the same bf16
    values (= ``linear(x, wp).float()`` bit for bit; an LM head's logits skip the widening copy)."""
    np_, kp, _ = wp.shape
    k = 2 * kp
    if x.dtype != torch.bfloat16 or x.shape[-1] != k or x.stride(-1) != 1:
        return None
    two_d = x.dim() == 2
    x2 = x if two_d else x.reshape(-1, k)  # a view where the rows allow it, else a copy
    m, ld = x2.shape[0], x2.stride(0)
    xp = x2.data_ptr()
    if x2.dim() != 2 or ld % 2 or xp % 4 or (m > 1 and ld < k):
        return None
    n = np_ * PANEL
    out = torch.empty(m, n, dtype=torch.float32 if out_f32 else torch.bfloat16)
    # the C function looked up once (library() costs ~1 us a call, ~0.1 ms a decode step over 121 linears)
    gemm = _state.get("gemm") or _state.setdefault("gemm", library().gemm)
    if m and gemm(xp, ld, wp.data_ptr(), m, n, k, 256 if k <= 1024 or m == 1 else 512, out.data_ptr(), n,
                  torch.get_num_threads(), out_f32):  # the K block of k_block_pairs(k, m), inlined (a call per linear)
        return None
    return out if two_d else out.view(*x.shape[:-1], n)


@torch.inference_mode()
def same_bits_as_onednn(weight: torch.Tensor, onednn_packed, wp: torch.Tensor, rows: int | None = None) -> bool:
    """This kernel vs oneDNN's packed linear on ``weight``, bit for bit, for ``rows`` random rows (6-row tiles and
    a tail; by default ~200 k outputs, 13 .. 397 rows: another K order flips ~1e-4 of bf16 outputs, so it shows)
    and for one row (oneDNN's one-row K block, :func:`k_block_pairs`)."""
    rows = rows or min(397, max(13, 200_000 // weight.shape[0] // 6 * 6 + 1))
    g = torch.Generator().manual_seed(0)
    for m in (rows, 1):
        x = (torch.randn(m, weight.shape[1], generator=g) * 2).to(torch.bfloat16)
        want, got = torch.ops.mkldnn._linear_pointwise(x, onednn_packed, None, "none", [], ""), linear(x, wp)
        if got is None or not torch.equal(got.view(torch.int16), want.view(torch.int16)):
            return False
    return True
