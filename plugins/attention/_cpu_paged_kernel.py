"""C kernel for decode attention straight over the paged KV cache on a CPU (built once with the C compiler).

Why: at decode batch 64 the reference backend spent ~40 % of a bf16 SmolLM2 step in attention (profile of
``benchmarks/cpu_profile.py``, docs/performance.md): half of it gathering every request's context blocks into
a padded copy (``index_select``), half in ``scaled_dot_product_attention`` over that copy with a mask. This
kernel reads each request's K/V rows where they lie in the cache (its block table), one (request, KV head)
pair per OpenMP task, and runs an online softmax in float32 block by block:

    for each block of the request:  s_t = scale * q . k_t           (the g query heads sharing this KV head)
                                    m' = max(m, max_t s_t);  acc = acc * e^(m - m') + sum_t e^(s_t - m') v_t

so nothing is copied, nothing is masked, and no Python loop runs per request. Caches of float32 or bfloat16
(widened to float32 as they are read); queries and output in float32. Plain C (the compiler vectorizes it for
the machine it runs on: AVX2, AVX-512, Arm), compiled with ``plugins/quant/cpu_build.py``'s ``cached_library`` into the
same cache directory as the quantized kernels, and run on torch's OpenMP pool (the same libgomp).
"""

from __future__ import annotations

import ctypes
import platform

import torch

from octavo.plugins.attention._cpu_paged_avx512 import AVX512_SOURCE
from octavo.plugins.attention._cpu_paged_generic import GENERIC_SOURCE
from octavo.plugins.quant.cpu_build import cached_library

C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <float.h>
#include <stdlib.h>

#define TILE 16
#define MAX_D 256

static inline float bf16_to_f(uint16_t v) { union { uint32_t u; float f; } c; c.u = (uint32_t)v << 16; return c.f; }

/* float32 -> bfloat16 bits, round to nearest even, NaN -> 0xFFFF: torch's Tensor.to(torch.bfloat16) */
static inline uint16_t f_to_bf16(float f) {
    union { float f; uint32_t u; } c; c.f = f;
    if (f != f) return 0xFFFF;  /* NaN: what torch's vectorized conversion writes */
    return (uint16_t)((c.u + 0x7FFFu + ((c.u >> 16) & 1u)) >> 16);
}

/* out row (at element offset `off`, float32 or bfloat16) = acc[0 .. n) * inv */
static inline void store_row(void* out, int out_bf16, long off, const float* acc, float inv, int n) {
    if (out_bf16) {
        uint16_t* o = (uint16_t*)out + off;
        for (int j = 0; j < n; j++) o[j] = f_to_bf16(acc[j] * inv);
    } else {
        float* o = (float*)out + off;
        for (int j = 0; j < n; j++) o[j] = acc[j] * inv;
    }
}

/* e^x for x <= 0 (0 below -87): 2^n * p(r), relative error ~2e-7. Plain arithmetic on arrays, so that the loop
   over a tile vectorizes on every ISA (libm's expf does not without -ffast-math); the exponent 2^n is built
   in an int32 array read back as float (the library is compiled with -fno-strict-aliasing) */
static inline void exp_tile(const float* x, float mx, float* out, int n) {
    int32_t e[TILE];
    float r[TILE];
    #pragma omp simd
    for (int t = 0; t < n; t++) {
        float v = x[t] - mx;
        v = v < -87.f ? -87.f : v;
        float f = v * 1.44269504f;
        int ni = (int)(f - 0.5f);  /* f <= 0: truncation of f - 0.5 rounds to nearest */
        float fn = (float)ni;
        float rr = v - fn * 0.693359375f + fn * 2.12194440e-4f;
        float p = 1.9875691500e-4f;
        p = p * rr + 1.3981999507e-3f;
        p = p * rr + 8.3334519073e-3f;
        p = p * rr + 4.1665795894e-2f;
        p = p * rr + 1.6666665459e-1f;
        p = p * rr + 5.0000001201e-1f;
        r[t] = p * rr * rr + rr + 1.f;
        e[t] = (ni + 127) << 23;
    }
    const float* scale = (const float*)e;
    #pragma omp simd
    for (int t = 0; t < n; t++) out[t] = r[t] * scale[t];
}

/* n rows of D elements, rows `stride` elements apart, to fp32 dst [n][D] */
static inline __attribute__((always_inline)) void load_rows(const void* cache, int is_bf16, long first, long stride,
                                                            int n, const int D, float* dst) {
    for (int t = 0; t < n; t++) {
        float* o = dst + t * D;
        if (is_bf16) {
            const uint16_t* src = (const uint16_t*)cache + first + t * stride;
            #pragma omp simd
            for (int j = 0; j < D; j++) o[j] = bf16_to_f(src[j]);
        } else {
            memcpy(o, (const float*)cache + first + t * stride, sizeof(float) * D);
        }
    }
}

%AVX512%

%GENERIC%

#define SPECIAL(DD, GG) if (d == DD && g == GG) { task(q, q_bf16, qstride, kc, vc, is_bf16, table, lens, r0, nr, h, \
                                                       nh, kvh, DD, GG, bs, scale, out, out_bf16, st); free(st); continue; }
#define SPECIAL_F(DD, GG) if (d == DD && g == GG) { task_f32(q, q_bf16, qstride, (const float*)kc, (const float*)vc, \
        table, lens, r0, nr, h, kvh, DD, GG, bs, scale, st, out, out_bf16, nh); free(st); continue; }
#define SPECIAL_DP(DD, GG) if (d == DD && g == GG) { task_bf16((const uint16_t*)q, qstride, (const uint16_t*)kc, \
        (const uint16_t*)vc, table, lens, r0, nr, h, kvh, DD, GG, bs, scale, st, out, out_bf16, nh); free(st); continue; }

/* out[r, h, :] = softmax(scale * q[r, h] . K^T) V over the first lens[r] positions of row r's request, whose
   position p lives in cache slot tables[row_req[r] * tstride + p / bs] * bs + p % bs; caches [slots, kvh, d].
   Tasks: rows task_row0[k] .. task_row0[k] + task_nrows[k] - 1 (all of one request) x each KV head.
   q: float32 or bfloat16 (q_bf16), rows qstride elements apart (heads contiguous); out [rows, nh, d] contiguous,
   float32 or bfloat16 (out_bf16). Returns 1 when the bf16 dot-product path ran (bf16 q and cache, d % 32 == 0 on
   an AVX-512 BF16 build), else 0. */
int paged_rows(const void* q, int q_bf16, long qstride, const void* kc, const void* vc, int is_bf16,
               const int64_t* tables, int tstride, const int64_t* row_req, const int64_t* lens,
               const int64_t* task_row0, const int64_t* task_nrows, int ntasks, int nh, int kvh, int d, int bs,
               float scale, void* out, int out_bf16, int nthreads) {
    int g = nh / kvh;
#ifdef PAGED_BF16_DP
    int dp = is_bf16 && q_bf16 && d % 32 == 0;
#else
    int dp = 0;
#endif
    /* Many tasks: each thread takes a task's kvh heads together (chunks of kvh in the k-major order), so the task of
       head 0, which requests every head's K/V rows into its core's L2 (_cpu_paged_avx512.py), is followed on the
       same core by the heads that use them; with chunks of 1 the two threads took alternate heads and read them
       from memory (decode batch 64, 30 layers, 2 threads: 16.9 -> 13.9 ms). Few tasks: one head per chunk, so the
       threads share them. The same bits either way: a task's result does not depend on where it runs. */
    const int chunk = ntasks >= 2 * nthreads ? kvh : 1;
    #pragma omp parallel for collapse(2) schedule(dynamic, chunk) num_threads(nthreads) if (nthreads > 1)
    for (int k = 0; k < ntasks; k++)
        for (int h = 0; h < kvh; h++) {
            long r0 = task_row0[k];
            int nr = (int)task_nrows[k];
            const int64_t* table = tables + row_req[r0] * (long)tstride;
            float* st = (float*)malloc(sizeof(float) * (size_t)nr * (2 * (size_t)g * d + 2 * (size_t)g));
#ifdef PAGED_BF16_DP
            if (dp) {
                SPECIAL_DP(64, 1) SPECIAL_DP(64, 2) SPECIAL_DP(64, 3) SPECIAL_DP(64, 4) SPECIAL_DP(64, 8)
                SPECIAL_DP(128, 1) SPECIAL_DP(128, 2) SPECIAL_DP(128, 4) SPECIAL_DP(128, 8)
                task_bf16((const uint16_t*)q, qstride, (const uint16_t*)kc, (const uint16_t*)vc, table, lens, r0, nr,
                          h, kvh, d, g, bs, scale, st, out, out_bf16, nh);
                free(st);
                continue;
            }
#endif
#ifdef PAGED_F32_V
            if (!is_bf16 && d % 16 == 0) { /* float32 cache: the AVX-512 task (_cpu_paged_avx512.py) */
                SPECIAL_F(64, 1) SPECIAL_F(64, 2) SPECIAL_F(64, 3) SPECIAL_F(64, 4) SPECIAL_F(64, 8)
                SPECIAL_F(128, 1) SPECIAL_F(128, 2) SPECIAL_F(128, 4) SPECIAL_F(128, 8)
                task_f32(q, q_bf16, qstride, (const float*)kc, (const float*)vc, table, lens, r0, nr, h, kvh, d, g,
                         bs, scale, st, out, out_bf16, nh);
                free(st);
                continue;
            }
#endif
            SPECIAL(64, 1) SPECIAL(64, 2) SPECIAL(64, 3) SPECIAL(64, 4) SPECIAL(64, 8)
            SPECIAL(128, 1) SPECIAL(128, 2) SPECIAL(128, 4) SPECIAL(128, 8)
            task(q, q_bf16, qstride, kc, vc, is_bf16, table, lens, r0, nr, h, nh, kvh, d, g, bs, scale, out, out_bf16,
                 st);
            free(st);
        }
    return dp;
}

/* this step's K and V rows (rowbytes each; rows kstride / vstride bytes apart) into cache slots slots[i] (caches of
   nslots rows of rowbytes): a plain copy, as index_copy_. Returns the number of slots out of range (none written) */
long kv_write(const char* k, long kstride, const char* v, long vstride, const int64_t* slots, long n, char* kc,
              char* vc, long nslots, long rowbytes, int nthreads) {
    long bad = 0;
    for (long i = 0; i < n; i++) bad += slots[i] < 0 || slots[i] >= nslots;
    if (bad) return bad;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && n >= 512)
    for (long i = 0; i < n; i++) {
        memcpy(kc + slots[i] * rowbytes, k + i * kstride, rowbytes);
        memcpy(vc + slots[i] * rowbytes, v + i * vstride, rowbytes);
    }
    return 0;
}
""".replace("%AVX512%", AVX512_SOURCE).replace("%GENERIC%", GENERIC_SOURCE)

# -fno-gcse: gcc spends about half of this kernel's compile (the largest of a cold start) in global CSE passes;
# without them it builds in 14 instead of 30 s on a quiet 2-vCPU Xeon, at the same speed (session 8 A/B, prefill
# attention per layer within noise) and the same results (CSE never reorders floating-point arithmetic).
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-strict-aliasing", "-fno-gcse", "-fno-gcse-after-reload",
          "-shared", "-fPIC"] + (["-mprefer-vector-width=512"] if platform.machine() in ("x86_64", "AMD64") else [])
_state: dict[str, object] = {}
#: the kernel's limits (its per-task buffers live on the stack): larger shapes use the reference path.
MAX_HEAD_SIZE, MAX_GROUP, MAX_BLOCK_SIZE = 256, 16, 128


def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None when it cannot be built here (the reason: :func:`unavailable_reason`)."""
    p, i = ctypes.c_void_p, ctypes.c_int
    return cached_library(_state, C_SOURCE, "octavo_paged_attn", _FLAGS,
                          {"paged_rows": ([p, i, ctypes.c_long, p, p, i, p, i, p, p, p, p, i, i, i, i, i,
                                           ctypes.c_float, p, i, i], i),
                           "kv_write": ([p, ctypes.c_long, p, ctypes.c_long, p, ctypes.c_long, p, p, ctypes.c_long,
                                         ctypes.c_long, i], ctypes.c_long)})


def unavailable_reason() -> str | None:
    library()
    return _state.get("why")  # type: ignore[return-value]


def shape_supported(kv_cache: torch.Tensor, num_heads: int) -> bool:
    """True when the kernel reads this cache: [2, blocks, block_size, kv_heads, d], fp32 or bf16, in its limits."""
    if kv_cache.dim() != 5 or kv_cache.dtype not in (torch.float32, torch.bfloat16) or not kv_cache.is_contiguous():
        return False
    _, _, bs, kvh, d = kv_cache.shape
    return d <= MAX_HEAD_SIZE and bs <= MAX_BLOCK_SIZE and num_heads % kvh == 0 and num_heads // kvh <= MAX_GROUP


#: query rows of one request per task: they share each loaded K/V tile (the result of a row does not depend on it)
ROWS_PER_TASK = 16


def row_tasks(query_start_loc: torch.Tensor, rows: int = ROWS_PER_TASK) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first row, row count)`` int64 of each task: every request's rows ``query_start_loc[i] ..
    query_start_loc[i + 1] - 1`` cut into runs of at most ``rows``."""
    qsl = query_start_loc.to(torch.int64)
    q_lens = qsl[1:] - qsl[:-1]
    chunks = (q_lens + rows - 1) // rows
    req = torch.repeat_interleave(torch.arange(q_lens.shape[0]), chunks)
    first_chunk = torch.cumsum(chunks, 0) - chunks
    row0 = qsl[:-1][req] + rows * (torch.arange(req.shape[0]) - first_chunk[req])
    return row0, torch.minimum(qsl[1:][req] - row0, torch.tensor(rows))


def paged_rows(q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor, row_req: torch.Tensor,
               lens: torch.Tensor, task_row0: torch.Tensor, task_nrows: torch.Tensor, scale: float,
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q [T, heads, d]``: row ``r`` attends to the first ``lens[r]`` cached positions of request ``row_req[r]``
    (block ids ``tables[row_req[r]]``) -> ``[T, heads, d]`` in ``out_dtype`` (float32, or bfloat16 rounded to
    nearest even as ``Tensor.to`` does). Tasks (:func:`row_tasks`) group rows of one request; each row's result
    is the same bits whatever the grouping, the batch or the thread count. float32 / bfloat16 queries are read in
    place (rows may be strided: a view of the fused QKV output); others are widened to float32 first."""
    lib = library()
    if q.dtype not in (torch.float32, torch.bfloat16) or q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        q = q.float().contiguous()
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype {out_dtype}: the kernel writes float32 or bfloat16")
    t, nh, d = q.shape
    _, _, bs, kvh, _ = kv_cache.shape
    tables, row_req, lens = (x.to(torch.int64).contiguous() for x in (tables, row_req, lens))
    task_row0, task_nrows = task_row0.to(torch.int64).contiguous(), task_nrows.to(torch.int64).contiguous()
    out = torch.empty(t, nh, d, dtype=out_dtype)
    _state["bf16_dot"] = bool(lib.paged_rows(
        q.data_ptr(), int(q.dtype == torch.bfloat16), q.stride(0), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(),
        int(kv_cache.dtype == torch.bfloat16), tables.data_ptr(), tables.shape[1], row_req.data_ptr(),
        lens.data_ptr(), task_row0.data_ptr(), task_nrows.data_ptr(), task_row0.shape[0], nh, kvh, d, bs,
        float(scale), out.data_ptr(), int(out_dtype == torch.bfloat16), torch.get_num_threads()))
    return out


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """``kv_cache[0|1]`` rows ``slot_mapping[i]`` = ``key[i]`` / ``value[i]`` (``[n, kv_heads, d]``, rows may be
    strided views of the fused QKV output): one C call for both instead of two ``index_copy_`` (~1.4 ms each for a
    2,048-token bf16 prefill step at 1 thread). Other dtypes or layouts take ``index_copy_`` (the same bytes)."""
    _, nb, bs, kvh, d = kv_cache.shape
    k_cache, v_cache = kv_cache[0].view(nb * bs, kvh, d), kv_cache[1].view(nb * bs, kvh, d)
    if (key.dtype != kv_cache.dtype or value.dtype != kv_cache.dtype or slot_mapping.dtype != torch.int64
            or not slot_mapping.is_contiguous() or any(t.stride(2) != 1 or t.stride(1) != d for t in (key, value))):
        k_cache.index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_cache.index_copy_(0, slot_mapping, value.to(v_cache.dtype))
        return
    es = kv_cache.element_size()
    bad = library().kv_write(key.data_ptr(), key.stride(0) * es, value.data_ptr(), value.stride(0) * es,
                             slot_mapping.data_ptr(), slot_mapping.shape[0], k_cache.data_ptr(), v_cache.data_ptr(),
                             nb * bs, kvh * d * es, torch.get_num_threads())
    if bad:
        raise IndexError(f"write_kv: {bad} slot(s) of slot_mapping outside the cache's {nb * bs} slots")


def last_call_used_bf16_dot() -> bool:
    """Whether the last :func:`paged_rows` call ran the AVX-512 BF16 dot-product path (``_cpu_paged_avx512``)."""
    return bool(_state.get("bf16_dot"))


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """``q [B, heads, d]`` (one token per request) against each request's first ``lens[b]`` cached positions
    (block ids ``tables [B, >= ceil(len / block_size)]``) -> float32 ``[B, heads, d]``: one task per row."""
    b = q.shape[0]
    ar = torch.arange(b, dtype=torch.int64)
    return paged_rows(q, kv_cache, tables, ar, lens.view(-1), ar, torch.ones(b, dtype=torch.int64), scale)
