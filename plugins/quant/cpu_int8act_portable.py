"""C of :mod:`.cpu_int8act` for CPUs without AVX-512 VNNI: the AVX2 + FMA path and the portable C path (kept apart
from :mod:`.cpu_int8act_src` so each file stays short; that module pastes this text in place, between its AVX-512
block and the shared drivers). Each output row's arithmetic is that of ``q4_rows`` / ``q8_rows`` whatever the tile
(batch invariance, see :mod:`.cpu_int8act_src`)."""

PORTABLE_C = r"""#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PATH "avx2"
static inline float hsum8(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

static inline float zdot(const float* z, const float* ds, int ng) {
    __m256 t = _mm256_setzero_ps();
    int g = 0;
    for (; g + 8 <= ng; g += 8) t = _mm256_fmadd_ps(_mm256_loadu_ps(z + g), _mm256_loadu_ps(ds + g), t);
    float r = 0.f;
    for (; g < ng; g++) r += z[g] * ds[g];
    return hsum8(t) + r;
}

static inline void q4_rows(const int8_t* xq, const float* d, const float* ds, int k, int ng, const uint8_t* w,
                           const float* s, const float* z, int MT, float* out) {
    __m256 acc[MAXM];
    for (int i = 0; i < MT; i++) acc[i] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int g0 = 0, c; g0 < ng; g0 += c) {
        c = chunk_len(g0, ng);
        for (int t = 0; t < c; t++) {
            int g = g0 + t;
            __m128i b = _mm_loadu_si128((const __m128i*)(w + g * 16));
            __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
            for (int i = 0; i < MT; i++) {
                const int8_t* x = xq + (long)i * k + g0 * G;
                __m256i xv = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)(x + 16 * c + 16 * t)),
                                              _mm_loadu_si128((const __m128i*)(x + 16 * t)));
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones);  /* 2 * 15 * 127 < 32767 */
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[g] * d[i * ng + g]), acc[i]);
            }
        }
    }
    for (int i = 0; i < MT; i++) out[i] = hsum8(acc[i]) + zdot(z, ds + i * ng, ng);
}

static inline __m256i dot16(const int8_t* a, const int8_t* b) {
    return _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)a)),
                             _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)b)));
}

static inline void q8_rows(const int8_t* xq, const float* d, int k, int ng, const int8_t* w, const float* s,
                           int MT, float* out) {
    __m256 acc[MAXM];
    for (int i = 0; i < MT; i++) acc[i] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++)
        for (int i = 0; i < MT; i++) {
            const int8_t* x = xq + (long)i * k + g * G;
            __m256i p = _mm256_add_epi32(dot16(w + g * G, x), dot16(w + g * G + 16, x + 16));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[g] * d[i * ng + g]), acc[i]);
        }
    for (int i = 0; i < MT; i++) out[i] = hsum8(acc[i]);
}
#else
#define PATH "generic"
static inline float zdot(const float* z, const float* ds, int ng) {
    float t = 0.f;
    for (int g = 0; g < ng; g++) t += z[g] * ds[g];
    return t;
}

static inline void q4_rows(const int8_t* xq, const float* d, const float* ds, int k, int ng, const uint8_t* w,
                           const float* s, const float* z, int MT, float* out) {
    for (int i = 0; i < MT; i++) {
        float t = 0.f;
        for (int g0 = 0, c; g0 < ng; g0 += c) {
            c = chunk_len(g0, ng);
            const int8_t* x = xq + (long)i * k + g0 * G;
            for (int u = 0; u < c; u++)
                t += s[g0 + u] * d[i * ng + g0 + u] * (float)isum4(w + (g0 + u) * 16, x + 16 * u, x + 16 * c + 16 * u);
        }
        out[i] = t + zdot(z, ds + i * ng, ng);
    }
}

static inline void q8_rows(const int8_t* xq, const float* d, int k, int ng, const int8_t* w, const float* s,
                           int MT, float* out) {
    for (int i = 0; i < MT; i++) {
        float t = 0.f;
        for (int g = 0; g < ng; g++) t += s[g] * d[i * ng + g] * (float)isum8(w + g * G, xq + (long)i * k + g * G);
        out[i] = t;
    }
}
#endif

#ifndef NRM
#define NRM 4
#define NRM8 4
/* AVX2 / portable: one output row at a time (each pair's arithmetic is that of q4_rows / q8_rows whatever NR, MT) */
static inline long pf_rows(long rb) { (void)rb; return 0; }  /* no software prefetch here */
static inline void q4_tile(const int8_t* xq, const float* d, const float* ds, int k, int ng, const uint8_t* w,
                           const float* s, const float* z, int NR, int MT, float* out, long pfr) {
    (void)pfr;
    for (int j = 0; j < NR; j++) {
        float o[MAXM];
        q4_rows(xq, d, ds, k, ng, w + (long)j * (k / 2), s + (long)j * ng, z + (long)j * ng, MT, o);
        for (int i = 0; i < MT; i++) out[i * NRM + j] = o[i];
    }
}

static inline void q8_tile(const int8_t* xq, const float* d, int k, int ng, const int8_t* w, const float* s,
                           int NR, int MT, float* out, long pfr) {
    (void)pfr;
    for (int j = 0; j < NR; j++) {
        float o[MAXM];
        q8_rows(xq, d, k, ng, w + (long)j * k, s + (long)j * ng, MT, o);
        for (int i = 0; i < MT; i++) out[i * NRM + j] = o[i];
    }
}
#endif

"""
