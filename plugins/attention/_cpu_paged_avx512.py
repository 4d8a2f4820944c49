"""AVX-512 parts of the ``cpu_paged`` C kernel (:mod:`._cpu_paged_kernel` splices this source into its own).

Why (session 7, issue 18): at batch 64 the kernel's tile loop cost a third of a bf16 decode step and ~2 s of
the 64 x 128 prefill, mostly in the scalar transposed load of each 16-key K tile (one widening store per
element). Here, on machines that compile with AVX-512:

- ``load_kt_f32``: a float32 K tile transposed to ``[D][16]`` with 16 x 16 dword shuffles instead of scalar
  stores; the scores then run the generic code's ``tile_scores`` unchanged (same sums, same bits);
- ``task_bf16`` (AVX-512 BF16, bfloat16 queries and cache, ``D % 32 == 0``): the K tile transposed as bf16
  *pairs* (dwords) and the scores computed with ``vdpbf16ps`` (bf16 x bf16 products are exact in float32,
  summed in float32: four fixed partial sums over the pairs, ``(a0 + a1) + (a2 + a3)``, times ``scale``);
  softmax and P.V stay in float32 exactly as in the generic task (V widened once per tile).

Invariance (docs/quantization.md "Prefix-cache invariance") is kept: the path is chosen by dtypes and head
size only, every row of a call runs the same code over the same key tiles from position 0, and a row's result
depends only on its query and its keys, never on the other rows of its task.
"""

AVX512_SOURCE = r"""
#if defined(__AVX512F__)
#include <immintrin.h>
#define PAGED_AVX512 1

/* r[0..15] (row i = 16 dwords) -> r[c] = column c, by unpack / shuffle stages (64 shuffles) */
static inline __attribute__((always_inline)) void tr16x16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {  /* u[4i + k], 128-bit lane L = column 4L + k of rows 4i .. 4i + 3 */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44), v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
        __m512i w0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
        r[k] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[4 + k] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        r[8 + k] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

/* 16 rows of `ndw` dwords (row t at rows[t]; ndw % 16 == 0) -> dst [ndw][16]: dst[c * 16 + t] = rows[t][c] */
static inline __attribute__((always_inline)) void transpose_rows(const uint32_t* const* rows, const int ndw,
                                                                  uint32_t* dst) {
    for (int c0 = 0; c0 < ndw; c0 += 16) {
        __m512i r[16];
        for (int t = 0; t < 16; t++) r[t] = _mm512_loadu_si512((const void*)(rows[t] + c0));
        tr16x16(r);
        for (int c = 0; c < 16; c++) _mm512_store_si512((void*)(dst + (c0 + c) * 16), r[c]);
    }
}

/* e^x for x <= 0 on 16 lanes: exp_tile's polynomial with explicit FMAs */
static inline __m512 exp512(__m512 v) {
    v = _mm512_max_ps(v, _mm512_set1_ps(-87.f));
    __m512 f = _mm512_mul_ps(v, _mm512_set1_ps(1.44269504f));
    __m512i ni = _mm512_cvttps_epi32(_mm512_sub_ps(f, _mm512_set1_ps(0.5f)));
    __m512 fn = _mm512_cvtepi32_ps(ni);
    __m512 rr = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), v);
    rr = _mm512_fmadd_ps(fn, _mm512_set1_ps(2.12194440e-4f), rr);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, rr, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, rr, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, rr, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, rr, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, rr, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, rr), rr, rr), _mm512_set1_ps(1.f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#endif

#if defined(__AVX512F__)
#define PAGED_F32_V 1
/* task() for a float32 cache (any q dtype), D % 16 == 0: the K tile transposed by shuffles, scores by FMAs over
   four fixed partial sums with the query pre-scaled (as the generic task), then the bf16 task's softmax and P.V
   (V rows read in place). st: scratch of nr * (2 * G * D + 2 * G) floats */
static inline __attribute__((always_inline)) void task_f32(
        const void* q, int q_bf16, long qstride, const float* kc, const float* vc, const int64_t* table,
        const int64_t* lens, long r0, int nr, int h, int kvh, const int D, const int G, int bs, float scale,
        float* st, void* out, int out_bf16, long nh) {
    uint32_t kt[D * TILE] __attribute__((aligned(64)));
    float pt[TILE] __attribute__((aligned(64)));
    static const uint32_t zeros[MAX_D] __attribute__((aligned(64))) = {0};
    float *qs = st, *acc = st + (long)nr * G * D, *m = acc + (long)nr * G * D, *s = m + (long)nr * G;
    long tok = (long)kvh * D, maxlen = 0;
    for (int r = 0; r < nr; r++) {
        for (int i = 0; i < G; i++) {
            long qoff = (r0 + r) * qstride + (long)(h * G + i) * D;
            float *qo = qs + ((long)r * G + i) * D, *ao = acc + ((long)r * G + i) * D;
            for (int j = 0; j < D; j++) {
                float qj = q_bf16 ? bf16_to_f(((const uint16_t*)q)[qoff + j]) : ((const float*)q)[qoff + j];
                qo[j] = qj * scale; ao[j] = 0.f;
            }
            m[r * G + i] = -FLT_MAX; s[r * G + i] = 0.f;
        }
        if (lens[r0 + r] > maxlen) maxlen = lens[r0 + r];
    }
    for (long pos = 0; pos < maxlen; pos++) { /* the task's K/V rows into L2 up front, as task_bf16 */
        const long off = (table[pos / bs] * bs + pos % bs) * tok + (long)h * D;
        for (long c = 0; c < (long)D; c += 16) {
            __builtin_prefetch(kc + off + c, 0, 2);
            __builtin_prefetch(vc + off + c, 0, 2);
        }
    }
    for (long t0 = 0; t0 < maxlen; t0 += TILE) {
        int nall = (int)(maxlen - t0 < TILE ? maxlen - t0 : TILE);
        const uint32_t* rows[TILE];
        const float* vrows[TILE];
        for (int t = 0; t < TILE; t++) {
            long pos = t0 + t;
            long first = t < nall ? (table[pos / bs] * bs + pos % bs) * tok + (long)h * D : 0;
            rows[t] = t < nall ? (const uint32_t*)(kc + first) : zeros;
            vrows[t] = vc + first;
        }
        if (t0 + TILE < maxlen) {
            long nn = maxlen - t0 - TILE < TILE ? maxlen - t0 - TILE : TILE;
            for (long t = 0; t < nn; t++) {
                long pos = t0 + TILE + t;
                long off = (table[pos / bs] * bs + pos % bs) * tok + (long)h * D;
                for (long c = 0; c < (long)D; c += 16) {
                    __builtin_prefetch(kc + off + c);
                    __builtin_prefetch(vc + off + c);
                }
            }
        }
        transpose_rows(rows, D, kt);
        const float* ktf = (const float*)kt;
        for (int r = 0; r < nr; r++) {
            long len = lens[r0 + r];
            if (len <= t0) continue;
            int n = (int)(len - t0 < TILE ? len - t0 : TILE);
            __mmask16 live = (__mmask16)((1u << n) - 1u);
            for (int i = 0; i < G; i++) {
                long ri = (long)r * G + i;
                const float* qi = qs + ri * D;
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int j = 0; j < D; j += 4) {
                    a0 = _mm512_fmadd_ps(_mm512_set1_ps(qi[j]), _mm512_load_ps(ktf + j * TILE), a0);
                    a1 = _mm512_fmadd_ps(_mm512_set1_ps(qi[j + 1]), _mm512_load_ps(ktf + (j + 1) * TILE), a1);
                    a2 = _mm512_fmadd_ps(_mm512_set1_ps(qi[j + 2]), _mm512_load_ps(ktf + (j + 2) * TILE), a2);
                    a3 = _mm512_fmadd_ps(_mm512_set1_ps(qi[j + 3]), _mm512_load_ps(ktf + (j + 3) * TILE), a3);
                }
                __m512 sc = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
                float mold = m[ri];
                float tm = _mm512_mask_reduce_max_ps(live, sc);
                float mx = tm > mold ? tm : mold;
                __m512 p = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(sc, _mm512_set1_ps(mx))));
                float sum = _mm512_reduce_add_ps(p);
                float* ai = acc + ri * D;
                if (mold == -FLT_MAX) {
                    s[ri] = sum;
                } else if (mx != mold) {
                    float corr = _mm512_cvtss_f32(exp512(_mm512_set1_ps(mold - mx)));
                    s[ri] = s[ri] * corr + sum;
                    const __m512 vc_ = _mm512_set1_ps(corr);
                    for (int j = 0; j < D; j += 16) _mm512_storeu_ps(ai + j, _mm512_mul_ps(_mm512_loadu_ps(ai + j), vc_));
                } else {
                    s[ri] = s[ri] + sum;
                }
                m[ri] = mx;
                _mm512_store_ps(pt, p);
                for (int j0 = 0; j0 < D; j0 += 64) {
                    const int w = D - j0 < 64 ? (D - j0) / 16 : 4;
                    __m512 b0 = _mm512_loadu_ps(ai + j0), b1 = b0, b2 = b0, b3 = b0;
                    if (w > 1) b1 = _mm512_loadu_ps(ai + j0 + 16);
                    if (w > 2) b2 = _mm512_loadu_ps(ai + j0 + 32);
                    if (w > 3) b3 = _mm512_loadu_ps(ai + j0 + 48);
                    for (int t = 0; t < n; t++) {
                        const __m512 pb = _mm512_permutexvar_ps(_mm512_set1_epi32(t), p);  /* as task_bf16 */
                        const float* vt = vrows[t] + j0;
                        b0 = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vt), b0);
                        if (w > 1) b1 = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vt + 16), b1);
                        if (w > 2) b2 = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vt + 32), b2);
                        if (w > 3) b3 = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vt + 48), b3);
                    }
                    _mm512_storeu_ps(ai + j0, b0);
                    if (w > 1) _mm512_storeu_ps(ai + j0 + 16, b1);
                    if (w > 2) _mm512_storeu_ps(ai + j0 + 32, b2);
                    if (w > 3) _mm512_storeu_ps(ai + j0 + 48, b3);
                }
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < G; i++) {
            long ri = (long)r * G + i;
            float inv = s[ri] > 0.f ? 1.f / s[ri] : 0.f;
            store_row(out, out_bf16, ((r0 + r) * nh + (long)h * G + i) * D, acc + ri * D, inv, D);
        }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define PAGED_BF16_DP 1
/* task() for bfloat16 queries and cache (see the module docstring of _cpu_paged_avx512.py); D % 32 == 0.
   q rows are `qstride` elements apart; st: scratch of nr * (G * D + 2 * G) floats */
static inline __attribute__((always_inline)) void task_bf16(
        const uint16_t* q, long qstride, const uint16_t* kc, const uint16_t* vc, const int64_t* table,
        const int64_t* lens, long r0, int nr, int h, int kvh, const int D, const int G, int bs, float scale,
        float* st, void* out, int out_bf16, long nh) {
    const int DP = D / 2;
    uint32_t kt[DP * TILE] __attribute__((aligned(64)));
    float vb[TILE * D] __attribute__((aligned(64)));
    float pt[TILE] __attribute__((aligned(64)));
    static const uint32_t zeros[MAX_D / 2] __attribute__((aligned(64))) = {0};
    float *acc = st, *m = acc + (long)nr * G * D, *s = m + (long)nr * G;
    long tok = (long)kvh * D, maxlen = 0;
    for (long i = 0; i < (long)nr * G * D; i++) acc[i] = 0.f;
    for (int i = 0; i < nr * G; i++) { m[i] = -FLT_MAX; s[i] = 0.f; }
    for (int r = 0; r < nr; r++) if (lens[r0 + r] > maxlen) maxlen = lens[r0 + r];
    const __m512 vscale = _mm512_set1_ps(scale);
    /* the whole task's K/V rows requested into L2 up front: one tile ahead alone left a decode step's cache read
       at ~5.6 GB/s (latency-bound: 30 layers x 64 rows at context 140 took 36.6 ms cold vs 17.7 ms hot) */
    /* the first KV head's task requests every head's rows (the tasks of heads > 0 of these rows come next) */
    const long span = (long)D * 2 * (h == 0 ? kvh : 1);
    for (long pos = 0; pos < maxlen; pos++) {
        const long off = ((table[pos / bs] * bs + pos % bs) * tok + (long)h * D) * 2;
        for (long c = 0; c < span; c += 64) {
            __builtin_prefetch((const char*)kc + off + c, 0, 2);
            __builtin_prefetch((const char*)vc + off + c, 0, 2);
        }
    }
    for (long t0 = 0; t0 < maxlen; t0 += TILE) {
        int nall = (int)(maxlen - t0 < TILE ? maxlen - t0 : TILE);
        const uint32_t* rows[TILE];
        for (int t = 0; t < TILE; t++) {
            if (t < nall) {
                long pos = t0 + t;
                long first = (table[pos / bs] * bs + pos % bs) * tok + (long)h * D;
                rows[t] = (const uint32_t*)(kc + first);
                const uint16_t* vsrc = vc + first;
                for (int j = 0; j < D; j += 16) {
                    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(vsrc + j)));
                    _mm512_store_ps(vb + t * D + j, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
                }
            } else {
                rows[t] = zeros;
            }
        }
        if (t0 + TILE < maxlen) { /* the next tile's rows: fetched while this one computes */
            long nn = maxlen - t0 - TILE < TILE ? maxlen - t0 - TILE : TILE;
            for (long t = 0; t < nn; t++) {
                long pos = t0 + TILE + t;
                long off = ((table[pos / bs] * bs + pos % bs) * tok + (long)h * D) * 2;
                for (long c = 0; c < (long)D * 2; c += 64) {
                    __builtin_prefetch((const char*)kc + off + c);
                    __builtin_prefetch((const char*)vc + off + c);
                }
            }
        }
        transpose_rows(rows, DP, kt);
        for (int r = 0; r < nr; r++) {
            long len = lens[r0 + r];
            if (len <= t0) continue;
            int n = (int)(len - t0 < TILE ? len - t0 : TILE);
            __mmask16 live = (__mmask16)((1u << n) - 1u);
            /* D = 64 and G <= 4: the heads' P.V run together after their softmax (below): each V row loaded once
               for all G heads and 4 x G independent FMA chains instead of G passes of 4; per head and lane the
               same FMAs in the same order, so the same bits */
            const int joint = D == 64 && G <= 4;
            __m512 pv[4], scj[4];
            if (joint) { /* the G heads' scores together: each K vector loaded once, 4 x G dot-product chains */
                __m512 a[4][4];
                for (int i = 0; i < G; i++)
                    for (int c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
                for (int j = 0; j < DP; j += 4) {
                    const __m512bh k0 = (__m512bh)_mm512_load_si512((const void*)(kt + j * TILE));
                    const __m512bh k1 = (__m512bh)_mm512_load_si512((const void*)(kt + (j + 1) * TILE));
                    const __m512bh k2 = (__m512bh)_mm512_load_si512((const void*)(kt + (j + 2) * TILE));
                    const __m512bh k3 = (__m512bh)_mm512_load_si512((const void*)(kt + (j + 3) * TILE));
                    for (int i = 0; i < G; i++) {
                        const uint32_t* qd = (const uint32_t*)(q + (r0 + r) * qstride + (long)(h * G + i) * D);
                        a[i][0] = _mm512_dpbf16_ps(a[i][0], (__m512bh)_mm512_set1_epi32((int)qd[j]), k0);
                        a[i][1] = _mm512_dpbf16_ps(a[i][1], (__m512bh)_mm512_set1_epi32((int)qd[j + 1]), k1);
                        a[i][2] = _mm512_dpbf16_ps(a[i][2], (__m512bh)_mm512_set1_epi32((int)qd[j + 2]), k2);
                        a[i][3] = _mm512_dpbf16_ps(a[i][3], (__m512bh)_mm512_set1_epi32((int)qd[j + 3]), k3);
                    }
                }
                for (int i = 0; i < G; i++) {
                    const __m512 lo = _mm512_add_ps(a[i][0], a[i][1]), hi = _mm512_add_ps(a[i][2], a[i][3]);
                    scj[i] = _mm512_mul_ps(_mm512_add_ps(lo, hi), vscale);  /* (a0 + a1) + (a2 + a3), as below */
                }
            }
            for (int i = 0; i < G; i++) {
                __m512 sc;
                if (joint) {
                    sc = scj[i];
                } else {
                    const uint32_t* qd = (const uint32_t*)(q + (r0 + r) * qstride + (long)(h * G + i) * D);
                    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                    for (int j = 0; j < DP; j += 4) {
                        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_set1_epi32((int)qd[j]),
                                              (__m512bh)_mm512_load_si512((const void*)(kt + j * TILE)));
                        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_set1_epi32((int)qd[j + 1]),
                                              (__m512bh)_mm512_load_si512((const void*)(kt + (j + 1) * TILE)));
                        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_set1_epi32((int)qd[j + 2]),
                                              (__m512bh)_mm512_load_si512((const void*)(kt + (j + 2) * TILE)));
                        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_set1_epi32((int)qd[j + 3]),
                                              (__m512bh)_mm512_load_si512((const void*)(kt + (j + 3) * TILE)));
                    }
                    sc = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), vscale);
                }
                long ri = (long)r * G + i;
                float mold = m[ri];
                float tm = _mm512_mask_reduce_max_ps(live, sc);
                float mx = tm > mold ? tm : mold;
                __m512 p = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(sc, _mm512_set1_ps(mx))));
                float sum = _mm512_reduce_add_ps(p);
                float* ai = acc + ri * D;
                /* corr = e^(mold - mx): 0 on the first tile (acc and s are 0 then), exactly 1 when the max did not
                   move (exp512(0) == 1.f, and x * 1 == x): both skip the rescale with the same bits */
                if (mold == -FLT_MAX) {
                    s[ri] = sum;
                } else if (mx != mold) {
                    float corr = _mm512_cvtss_f32(exp512(_mm512_set1_ps(mold - mx)));
                    s[ri] = s[ri] * corr + sum;
                    const __m512 vc_ = _mm512_set1_ps(corr);
                    for (int j = 0; j < D; j += 16) _mm512_storeu_ps(ai + j, _mm512_mul_ps(_mm512_loadu_ps(ai + j), vc_));
                } else {
                    s[ri] = s[ri] + sum;
                }
                m[ri] = mx;
                if (joint) {
                    pv[i] = p;
                    continue;
                }
                _mm512_store_ps(pt, p);
                /* P.V: key t outer, the head's D / 16 accumulators in registers (each lane: the same FMAs in
                   the same order as one accumulator per 16 columns) */
                for (int j0 = 0; j0 < D; j0 += 64) {
                    const int w = D - j0 < 64 ? (D - j0) / 16 : 4;
                    __m512 a0 = _mm512_loadu_ps(ai + j0), a1 = a0, a2 = a0, a3 = a0;
                    if (w > 1) a1 = _mm512_loadu_ps(ai + j0 + 16);
                    if (w > 2) a2 = _mm512_loadu_ps(ai + j0 + 32);
                    if (w > 3) a3 = _mm512_loadu_ps(ai + j0 + 48);
                    for (int t = 0; t < n; t++) {
                        /* p[t] on 16 lanes from the register (a store + 16 scalar reloads stalled on forwarding) */
                        const __m512 pb = _mm512_permutexvar_ps(_mm512_set1_epi32(t), p);
                        const float* vt = vb + t * D + j0;
                        a0 = _mm512_fmadd_ps(pb, _mm512_load_ps(vt), a0);
                        if (w > 1) a1 = _mm512_fmadd_ps(pb, _mm512_load_ps(vt + 16), a1);
                        if (w > 2) a2 = _mm512_fmadd_ps(pb, _mm512_load_ps(vt + 32), a2);
                        if (w > 3) a3 = _mm512_fmadd_ps(pb, _mm512_load_ps(vt + 48), a3);
                    }
                    _mm512_storeu_ps(ai + j0, a0);
                    if (w > 1) _mm512_storeu_ps(ai + j0 + 16, a1);
                    if (w > 2) _mm512_storeu_ps(ai + j0 + 32, a2);
                    if (w > 3) _mm512_storeu_ps(ai + j0 + 48, a3);
                }
            }
            if (joint) {
                float* ar = acc + (long)r * G * D;  /* the row's G heads, D floats each */
                __m512 A[4][4];
                for (int i = 0; i < G; i++)
                    for (int c = 0; c < 4; c++) A[i][c] = _mm512_loadu_ps(ar + i * D + 16 * c);
                for (int t = 0; t < n; t++) {
                    const float* vt = vb + t * D;
                    const __m512 v0 = _mm512_load_ps(vt), v1 = _mm512_load_ps(vt + 16);
                    const __m512 v2 = _mm512_load_ps(vt + 32), v3 = _mm512_load_ps(vt + 48);
                    const __m512i it = _mm512_set1_epi32(t);
                    for (int i = 0; i < G; i++) {
                        const __m512 pb = _mm512_permutexvar_ps(it, pv[i]);
                        A[i][0] = _mm512_fmadd_ps(pb, v0, A[i][0]);
                        A[i][1] = _mm512_fmadd_ps(pb, v1, A[i][1]);
                        A[i][2] = _mm512_fmadd_ps(pb, v2, A[i][2]);
                        A[i][3] = _mm512_fmadd_ps(pb, v3, A[i][3]);
                    }
                }
                for (int i = 0; i < G; i++)
                    for (int c = 0; c < 4; c++) _mm512_storeu_ps(ar + i * D + 16 * c, A[i][c]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < G; i++) {
            long ri = (long)r * G + i;
            float inv = s[ri] > 0.f ? 1.f / s[ri] : 0.f;
            store_row(out, out_bf16, ((r0 + r) * nh + (long)h * G + i) * D, acc + ri * D, inv, D);
        }
}
#endif
"""
