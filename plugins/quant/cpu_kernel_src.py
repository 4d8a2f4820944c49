"""C source of :mod:`.cpu_kernel` (fp32 kernels for int4 / int8 group-quantized weights): kept apart so the
Python wrapper stays short. The layouts, the math and when each path runs are described there; the C comments
say why each step is written the way it is. The text is the library's cache key (:func:`.cpu_build.compile_shared_library`
hashes it), so an edit here rebuilds the kernels once."""

C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#define G 32
#define MT 4
/* threads only for big matrices: a parallel region costs more than a small layer's product */
#define PAR_MIN (1L << 16)

static void group_sums(const float* x, int m, int k, float* xs) {
    int ng = k / G;
    for (int i = 0; i < m; i++)
        for (int g = 0; g < ng; g++) {
            float t = 0.f;
            for (int j = 0; j < G; j++) t += x[(long)i * k + g * G + j];
            xs[i * ng + g] = t;
        }
}

#ifdef __AVX512F__
#include <immintrin.h>
/* one output row r of the int4 product for rows i0 .. i0 + mt of x */
static inline void q4_row(const float* x, int k, int ng, const uint8_t* wr, const float* sr, const float* zr,
                          const float* xs, int i0, int mt, float* out) {
    __m512 acc[MT];
    float zacc[MT];
    for (int i = 0; i < MT; i++) { acc[i] = _mm512_setzero_ps(); zacc[i] = 0.f; }
    const __m512i mask = _mm512_set1_epi32(15);
    for (int g = 0; g < ng; g++) {
        __m512i bi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wr + g * 16)));
        __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(bi, mask));
        __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bi, 4));
        __m512 sg = _mm512_set1_ps(sr[g]);
        for (int i = 0; i < mt; i++) {
            const float* xg = x + (long)(i0 + i) * k + g * G;
            __m512 t = _mm512_mul_ps(lo, _mm512_loadu_ps(xg));
            t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xg + 16), t);
            acc[i] = _mm512_fmadd_ps(t, sg, acc[i]);
            zacc[i] += zr[g] * xs[(i0 + i) * ng + g];
        }
    }
    for (int i = 0; i < mt; i++) out[i] = _mm512_reduce_add_ps(acc[i]) + zacc[i];
}

static inline void q8_row(const float* x, int k, int ng, const int8_t* wr, const float* sr, int i0, int mt,
                          float* out) {
    __m512 acc[MT];
    for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(wr + g * G))));
        __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(wr + g * G + 16))));
        __m512 sg = _mm512_set1_ps(sr[g]);
        for (int i = 0; i < mt; i++) {
            const float* xg = x + (long)(i0 + i) * k + g * G;
            __m512 t = _mm512_mul_ps(q0, _mm512_loadu_ps(xg));
            t = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xg + 16), t);
            acc[i] = _mm512_fmadd_ps(t, sg, acc[i]);
        }
    }
    for (int i = 0; i < mt; i++) out[i] = _mm512_reduce_add_ps(acc[i]);
}
#else
static inline void q4_row(const float* x, int k, int ng, const uint8_t* wr, const float* sr, const float* zr,
                          const float* xs, int i0, int mt, float* out) {
    float acc[MT][16];
    float zacc[MT];
    memset(acc, 0, sizeof(acc));
    memset(zacc, 0, sizeof(zacc));
    for (int g = 0; g < ng; g++) {
        const uint8_t* b = wr + g * 16;
        float lo[16], hi[16];
        for (int j = 0; j < 16; j++) { lo[j] = (float)(b[j] & 15); hi[j] = (float)(b[j] >> 4); }
        for (int i = 0; i < mt; i++) {
            const float* xg = x + (long)(i0 + i) * k + g * G;
            for (int j = 0; j < 16; j++) acc[i][j] += sr[g] * (lo[j] * xg[j] + hi[j] * xg[16 + j]);
            zacc[i] += zr[g] * xs[(i0 + i) * ng + g];
        }
    }
    for (int i = 0; i < mt; i++) {
        float t = 0.f;
        for (int j = 0; j < 16; j++) t += acc[i][j];
        out[i] = t + zacc[i];
    }
}

static inline void q8_row(const float* x, int k, int ng, const int8_t* wr, const float* sr, int i0, int mt,
                          float* out) {
    float acc[MT][G];
    memset(acc, 0, sizeof(acc));
    for (int g = 0; g < ng; g++)
        for (int i = 0; i < mt; i++) {
            const float* xg = x + (long)(i0 + i) * k + g * G;
            for (int j = 0; j < G; j++) acc[i][j] += sr[g] * ((float)wr[g * G + j] * xg[j]);
        }
    for (int i = 0; i < mt; i++) {
        float t = 0.f;
        for (int j = 0; j < G; j++) t += acc[i][j];
        out[i] = t;
    }
}
#endif

static float zdot(const float* z, const float* xs, int ng) {
    float t = 0.f;
    #pragma omp simd reduction(+:t)
    for (int g = 0; g < ng; g++) t += z[g] * xs[g];
    return t;
}

#ifdef __AVX512F__
/* one activation row, four weight rows at a time: independent accumulators hide the FMA latency and each
   activation block is loaded once for the four rows */
static void q4_vec4(const float* x, int k, int ng, const uint8_t* w, const float* s, const float* z,
                    const float* xs, int r, float* y) {
    __m512 acc[4];
    for (int j = 0; j < 4; j++) acc[j] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi32(15);
    long kb = k / 2;
    for (int g = 0; g < ng; g++) {
        __m512 x0 = _mm512_loadu_ps(x + g * G), x1 = _mm512_loadu_ps(x + g * G + 16);
        for (int j = 0; j < 4; j++) {
            __m512i bi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(w + (r + j) * kb + g * 16)));
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(bi, mask)), x0);
            t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bi, 4)), x1, t);
            acc[j] = _mm512_fmadd_ps(t, _mm512_set1_ps(s[(long)(r + j) * ng + g]), acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) y[r + j] = _mm512_reduce_add_ps(acc[j]) + zdot(z + (long)(r + j) * ng, xs, ng);
}

static void q8_vec4(const float* x, int k, int ng, const int8_t* w, const float* s, int r, float* y) {
    __m512 acc[4];
    for (int j = 0; j < 4; j++) acc[j] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512 x0 = _mm512_loadu_ps(x + g * G), x1 = _mm512_loadu_ps(x + g * G + 16);
        for (int j = 0; j < 4; j++) {
            const int8_t* b = w + (long)(r + j) * k + g * G;
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)b))), x0);
            t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 16)))),
                                x1, t);
            acc[j] = _mm512_fmadd_ps(t, _mm512_set1_ps(s[(long)(r + j) * ng + g]), acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) y[r + j] = _mm512_reduce_add_ps(acc[j]);
}
#define HAVE_VEC4 1
#endif

/* y[m, n] = x[m, k] . dequant(w)[n, k]^T, int4 weights, m * k / 32 <= 16384 */
void q4_gemm(const float* x, int m, int k, const uint8_t* w, const float* s, const float* z,
             int n, float* y, int nthreads) {
    int ng = k / G;
    float xs[16 * 1024];
    group_sums(x, m, k, xs);
#ifdef HAVE_VEC4
    if (m == 1) {
        int n4 = n / 4 * 4;
        #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
        for (int r = 0; r < n4; r += 4) q4_vec4(x, k, ng, w, s, z, xs, r, y);
        for (int r = n4; r < n; r++) {
            float out[MT];
            q4_row(x, k, ng, w + (long)r * (k / 2), s + (long)r * ng, z + (long)r * ng, xs, 0, 1, out);
            y[r] = out[0];
        }
        return;
    }
#endif
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
    for (int r = 0; r < n; r++)
        for (int i0 = 0; i0 < m; i0 += MT) {
            int mt = m - i0 < MT ? m - i0 : MT;
            float out[MT];
            q4_row(x, k, ng, w + (long)r * (k / 2), s + (long)r * ng, z + (long)r * ng, xs, i0, mt, out);
            for (int i = 0; i < mt; i++) y[(long)(i0 + i) * n + r] = out[i];
        }
}

/* int8 weights with a scale per group of 32 (no zero) */
void q8_gemm(const float* x, int m, int k, const int8_t* w, const float* s, int n, float* y, int nthreads) {
    int ng = k / G;
#ifdef HAVE_VEC4
    if (m == 1) {
        int n4 = n / 4 * 4;
        #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
        for (int r = 0; r < n4; r += 4) q8_vec4(x, k, ng, w, s, r, y);
        for (int r = n4; r < n; r++) {
            float out[MT];
            q8_row(x, k, ng, w + (long)r * k, s + (long)r * ng, 0, 1, out);
            y[r] = out[0];
        }
        return;
    }
#endif
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
    for (int r = 0; r < n; r++)
        for (int i0 = 0; i0 < m; i0 += MT) {
            int mt = m - i0 < MT ? m - i0 : MT;
            float out[MT];
            q8_row(x, k, ng, w + (long)r * k, s + (long)r * ng, i0, mt, out);
            for (int i = 0; i < mt; i++) y[(long)(i0 + i) * n + r] = out[i];
        }
}

void q4_dequant(const uint8_t* w, const float* s, const float* z, int n, int k, float* out, int nthreads) {
    int ng = k / G;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
    for (int r = 0; r < n; r++)
        for (int g = 0; g < ng; g++) {
            const uint8_t* b = w + (long)r * (k / 2) + g * 16;
            float sg = s[(long)r * ng + g], zg = z[(long)r * ng + g];
            float* o = out + (long)r * k + g * G;
            #pragma omp simd
            for (int j = 0; j < 16; j++) { o[j] = (float)(b[j] & 15) * sg + zg; o[16 + j] = (float)(b[j] >> 4) * sg + zg; }
        }
}

void q8_dequant(const int8_t* w, const float* s, int n, int k, float* out, int nthreads) {
    int ng = k / G;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
    for (int r = 0; r < n; r++)
        for (int g = 0; g < ng; g++) {
            float sg = s[(long)r * ng + g];
            #pragma omp simd
            for (int j = 0; j < G; j++) out[(long)r * k + g * G + j] = (float)w[(long)r * k + g * G + j] * sg;
        }
}
"""
