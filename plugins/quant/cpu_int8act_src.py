"""C source of :mod:`.cpu_int8act` (int8 activations x int4 / int8 weights, few rows): kept apart so the Python
wrapper stays short. The layouts, the math and the code paths are described there; the C comments say why
each step is written the way it is."""

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#define G 32
#define MAXM 16
#define PAR_MIN (1L << 16)

/* Activation layouts. NATURAL: element j of block g at g * 32 + j (int8 weights). NIBBLE (int4 weights): the
   blocks are cut into chunks of 4 (then one of 2, then one of 1 for what is left); in a chunk of c blocks
   starting at block g0 (bytes g0 * 32 ...), elements 0..15 of block g0 + t sit at t * 16 and elements 16..31
   at 16 c + t * 16, so the low and the high nibbles of c packed weight blocks (16 bytes each, contiguous)
   meet their activations in two plain loads. */
static inline int chunk_len(int g0, int ng) { return ng - g0 >= 4 ? 4 : (ng - g0 >= 2 ? 2 : 1); }

/* one 4-bit block (byte j = elem j | elem j+16 << 4) against its activation halves lo / hi: exact int dot */
static inline int isum4(const uint8_t* b, const int8_t* lo, const int8_t* hi) {
    int t = 0;
    for (int j = 0; j < 16; j++) t += (int)(b[j] & 15) * lo[j] + (int)(b[j] >> 4) * hi[j];
    return t;
}

static inline int isum8(const int8_t* w, const int8_t* xq) {
    int t = 0;
    for (int j = 0; j < G; j++) t += (int)w[j] * xq[j];
    return t;
}

static inline float load_x(const void* x, int bf16, long idx) {
    if (bf16) { uint32_t u = (uint32_t)((const uint16_t*)x)[idx] << 16; float f; memcpy(&f, &u, 4); return f; }
    return ((const float*)x)[idx];
}

/* portable quantization of one block (the reference the vector code must equal bit for bit) */
static inline void quant_block_c(const void* x, int bf16, long off, int8_t* lo, int8_t* hi, float* d, float* ds) {
    float v[G], amax = 0.f;
    for (int j = 0; j < G; j++) { v[j] = load_x(x, bf16, off + j); float a = fabsf(v[j]); amax = a > amax ? a : amax; }
    float dg = amax / 127.0f;
    int sum = 0;
    for (int j = 0; j < G; j++) {
        int t = dg > 0.f ? (int)nearbyintf(v[j] / dg) : 0;
        t = t > 127 ? 127 : (t < -127 ? -127 : t);
        (j < 16 ? lo : hi - 16)[j] = (int8_t)t;
        sum += t;
    }
    *d = dg;
    *ds = dg * (float)sum;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define PATH "avx512vnni"
static inline float zdot(const float* z, const float* ds, int ng) {
    __m512 t = _mm512_setzero_ps();
    for (int g = 0; g < ng; g += 16) {
        __mmask16 mk = ng - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ng - g)) - 1);
        t = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, z + g), _mm512_maskz_loadu_ps(mk, ds + g), t);
    }
    return _mm512_reduce_add_ps(t);
}

static inline void quant_block(const void* x, int bf16, long off, int8_t* lo, int8_t* hi, float* d, float* ds) {
    __m512 v0, v1;
    if (bf16) {
        const uint16_t* b = (const uint16_t*)x + off;
        v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)b)), 16));
        v1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b + 16))), 16));
    } else {
        v0 = _mm512_loadu_ps((const float*)x + off);
        v1 = _mm512_loadu_ps((const float*)x + off + 16);
    }
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float dg = amax / 127.0f;
    if (!(dg > 0.f)) { quant_block_c(x, bf16, off, lo, hi, d, ds); return; }  /* zero (or NaN) block */
    const __m512 dv = _mm512_set1_ps(dg);
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v0, dv), rnd));
    __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v1, dv), rnd));
    const __m512i hi127 = _mm512_set1_epi32(127), lo127 = _mm512_set1_epi32(-127);
    i0 = _mm512_max_epi32(_mm512_min_epi32(i0, hi127), lo127);
    i1 = _mm512_max_epi32(_mm512_min_epi32(i1, hi127), lo127);
    _mm_storeu_si128((__m128i*)lo, _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128((__m128i*)hi, _mm512_cvtepi32_epi8(i1));
    *d = dg;
    *ds = dg * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}

/* output row r (w, s, z of that row) for activation rows 0..MT-1 (a constant after inlining) */
static inline void q4_rows(const int8_t* xq, const float* d, const float* ds, int k, int ng, const uint8_t* w,
                           const float* s, const float* z, int MT, float* out) {
    static const int idx4[16] = {0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,3};
    __m512 acc[MAXM];
    __m256 acc2[MAXM];
    for (int i = 0; i < MT; i++) { acc[i] = _mm512_setzero_ps(); acc2[i] = _mm256_setzero_ps(); }
    const __m512i m4 = _mm512_set1_epi8(15), perm = _mm512_loadu_si512(idx4);
    int g = 0;
    for (; g + 4 <= ng; g += 4) {  /* 4 blocks: 64 weight bytes, 128 activations */
        __m512i v = _mm512_loadu_si512(w + g * 16);
        __m512i ql = _mm512_and_si512(v, m4), qh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        __m128 sg = _mm_loadu_ps(s + g);
        for (int i = 0; i < MT; i++) {
            const int8_t* x = xq + (long)i * k + g * G;
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ql, _mm512_loadu_si512(x));
            p = _mm512_dpbusd_epi32(p, qh, _mm512_loadu_si512(x + 64));
            __m512 sc = _mm512_permutexvar_ps(perm, _mm512_castps128_ps512(_mm_mul_ps(sg, _mm_loadu_ps(d + i * ng + g))));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[i]);
        }
    }
    if (ng - g >= 2) {  /* a chunk of 2 blocks */
        __m256i v = _mm256_loadu_si256((const __m256i*)(w + g * 16));
        const __m256i m4h = _mm256_set1_epi8(15);
        __m256i ql = _mm256_and_si256(v, m4h), qh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4h);
        for (int i = 0; i < MT; i++) {
            const int8_t* x = xq + (long)i * k + g * G;
            __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ql, _mm256_loadu_si256((const __m256i*)x));
            p = _mm256_dpbusd_epi32(p, qh, _mm256_loadu_si256((const __m256i*)(x + 32)));
            __m256 sc = _mm256_set_m128(_mm_set1_ps(s[g + 1] * d[i * ng + g + 1]), _mm_set1_ps(s[g] * d[i * ng + g]));
            acc2[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc2[i]);
        }
        g += 2;
    }
    for (int i = 0; i < MT; i++) {
        __m256 h = _mm256_add_ps(acc2[i], _mm256_add_ps(_mm512_castps512_ps256(acc[i]),
                                                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1))));
        __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        h4 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
        float t = _mm_cvtss_f32(_mm_add_ss(h4, _mm_movehdup_ps(h4)));
        if (g < ng) {  /* a last single block */
            const int8_t* x = xq + (long)i * k + g * G;
            t += s[g] * d[i * ng + g] * (float)isum4(w + g * 16, x, x + 16);
        }
        out[i] = t + zdot(z, ds + i * ng, ng);
    }
}

/* the [s0 d0 x8, s1 d1 x8] scale vector of a pair of blocks */
static inline __m512 pair_scale(const float* s, const float* d) {
    static const int idx[16] = {0,0,0,0,0,0,0,0,1,1,1,1,1,1,1,1};
    __m128 sd = _mm_mul_ps(_mm_castpd_ps(_mm_load_sd((const double*)s)), _mm_castpd_ps(_mm_load_sd((const double*)d)));
    return _mm512_permutexvar_ps(_mm512_loadu_si512(idx), _mm512_castps128_ps512(sd));
}

static inline void q8_rows(const int8_t* xq, const float* d, int k, int ng, const int8_t* w, const float* s,
                           int MT, float* out) {
    __m512 acc[MAXM];
    for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    int g = 0;
    for (; g + 2 <= ng; g += 2) {
        __m512i q = _mm512_loadu_si512(w + g * G);
        __m512i corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, q);  /* 128 * sum(q) per 4 bytes */
        for (int i = 0; i < MT; i++) {
            __m512i xu = _mm512_xor_si512(_mm512_loadu_si512(xq + (long)i * k + g * G), c128);  /* xq + 128 */
            __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), xu, q), corr);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), pair_scale(s + g, d + i * ng + g), acc[i]);
        }
    }
    for (int i = 0; i < MT; i++) {
        float t = _mm512_reduce_add_ps(acc[i]);
        if (g < ng) t += s[g] * d[i * ng + g] * (float)isum8(w + g * G, xq + (long)i * k + g * G);
        out[i] = t;
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
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

const char* kernel_path(void) { return PATH; }

/* xq [m, k] int8 in layout `nibble` (1: NIBBLE, 0: NATURAL), d[i, g] = amax / 127 (xq = 0 where d = 0),
   ds[i, g] = d * sum(xq) over the block */
void quant_act(const void* x, int bf16, int m, int k, int nibble, int8_t* xq, float* d, float* ds) {
    int ng = k / G;
    for (int i = 0; i < m; i++)
        for (int g0 = 0, c; g0 < ng; g0 += c) {
            c = nibble ? chunk_len(g0, ng) : 1;
            for (int t = 0; t < c; t++) {
                int8_t* base = xq + (long)i * k + g0 * G;
                long off = (long)i * k + (g0 + t) * G;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
                quant_block(x, bf16, off, base + 16 * t, base + 16 * c + 16 * t, d + i * ng + g0 + t, ds + i * ng + g0 + t);
#else
                quant_block_c(x, bf16, off, base + 16 * t, base + 16 * c + 16 * t, d + i * ng + g0 + t, ds + i * ng + g0 + t);
#endif
            }
        }
}

/* rows of x in chunks of up to 4 (each chunk's accumulators stay in registers; the constant MT lets the
   compiler unroll the activation-row loop) */
#define CHUNKS(CALL)                                                        \
    for (int i0 = 0; i0 < m; i0 += 4) {                                      \
        int mt = m - i0 < 4 ? m - i0 : 4;                                    \
        float out[4];                                                        \
        switch (mt) { case 1: CALL(1); break; case 2: CALL(2); break;        \
                      case 3: CALL(3); break; default: CALL(4); }            \
        for (int i = 0; i < mt; i++) y[(long)(i0 + i) * n + r] = out[i];     \
    }

/* y[m, n] from an activation quantized in the NIBBLE layout and int4 weights w [n, k/2], s, z [n, k/32] */
int q4a8_gemm_q(const int8_t* xq, const float* d, const float* ds, int m, int k, const uint8_t* w,
                const float* s, const float* z, int n, float* y, int nthreads) {
    if (m > MAXM || k % G) return -1;
    int ng = k / G;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
    for (int r = 0; r < n; r++) {
#define Q4(MT) q4_rows(xq + (long)i0 * k, d + i0 * ng, ds + i0 * ng, k, ng, w + (long)r * (k / 2), \
                       s + (long)r * ng, z + (long)r * ng, MT, out)
        CHUNKS(Q4)
    }
    return 0;
}

/* the same for int8 weights w [n, k] with a scale per block, activation in the NATURAL layout */
int q8a8_gemm_q(const int8_t* xq, const float* d, int m, int k, const int8_t* w, const float* s, int n, float* y,
                int nthreads) {
    if (m > MAXM || k % G) return -1;
    int ng = k / G;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && (long)n * k >= PAR_MIN)
    for (int r = 0; r < n; r++) {
#define Q8(MT) q8_rows(xq + (long)i0 * k, d + i0 * ng, k, ng, w + (long)r * k, s + (long)r * ng, MT, out)
        CHUNKS(Q8)
    }
    return 0;
}

#define STACK_BYTES 32768
/* quantize x (float32 or bfloat16 [m, k]) then the product: one call per linear; bits 4 or 8 */
int qa8_gemm(int bits, const void* x, int bf16, int m, int k, const void* w, const float* s, const float* z,
             int n, float* y, int nthreads) {
    if (m > MAXM || k % G || m < 0) return -1;
    int ng = k / G;
    size_t need = (size_t)m * k + 2 * sizeof(float) * m * ng + 64;
    char stack[STACK_BYTES];
    char* buf = need <= STACK_BYTES ? stack : (char*)malloc(need);
    if (!buf) return -2;
    float* d = (float*)buf;
    float* ds = d + m * ng;
    int8_t* xq = (int8_t*)(ds + m * ng);
    quant_act(x, bf16, m, k, bits == 4, xq, d, ds);
    int rc = bits == 4 ? q4a8_gemm_q(xq, d, ds, m, k, (const uint8_t*)w, s, z, n, y, nthreads)
                       : q8a8_gemm_q(xq, d, m, k, (const int8_t*)w, s, n, y, nthreads);
    if (buf != stack) free(buf);
    return rc;
}
"""
