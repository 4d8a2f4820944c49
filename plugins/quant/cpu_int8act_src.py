"""C source of :mod:`.cpu_int8act` (int8 activations x int4 / int8 weights, any number of rows): kept apart so the Python
wrapper stays short. The layouts, the math and the code paths are described there; the C comments say why
each step is written the way it is. The AVX2 and portable paths are :mod:`.cpu_int8act_portable`'s text, pasted in
after the AVX-512 block (one C file, one library)."""

from octavo.plugins.quant.cpu_int8act_portable import PORTABLE_C

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#define G 32
#define MAXM 4  /* activation rows per chunk (the accumulators of one chunk stay in registers) */
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

/* Output rows r .. r + NR - 1 (w, s, z point at row r; rows kb bytes / ng scales apart) for activation rows
   0 .. MT - 1; NR, MT <= 4 are constants after inlining. out[i * NRM + j]. Every (activation row, output row) pair
   runs the same operations whatever NR and MT: blocks in the chunks of 4, 2, 1 of the NIBBLE layout, each chunk
   in one 512-bit register (masked loads zero what a short chunk lacks, so a lane outside it adds +0), its int32
   dots scaled by s * d and accumulated in the pair's 16 float lanes; then the zero term z * ds, 16 blocks a step;
   then one horizontal sum. The weight loads and unpacking are shared by the MT activation rows, the activation
   loads by the NR output rows: each weight byte is read once per chunk of up to 4 activation rows. */
/* Software prefetch into L2 of the rows PF_BYTES ahead of the tile (pf_rows: at least PF_BYTES of the weight rows),
   at the columns the tile reads now: one 64-byte line of weights per row per chunk, the row's scales and zeros
   every 16 blocks. Why: at batch 1 every weight byte comes from DRAM once per token, and the hardware prefetchers
   do not keep up with a tile's interleaved row streams: on a Zen 4 EPYC (1 thread, a token's weight stream in the
   model's order, benchmarks/cpu_kernel_stream.py) the 30 down_proj (k = 1536) took 2.29 ms without, 1.83 ms with
   prefetches into L1 (_MM_HINT_T0) and 0.97 ms with these into L2; the int8 LM head 3.64 / 3.06 / 1.36 ms; the
   k = 576 int4 layers gain 10 % (T0 and T1 alike); the token's 121 calls 9.9 -> 6.1 ms. 6-24 KB ahead measured
   alike. Only the first chunk of activation rows of a tile prefetches (pfr 0 for the others: the rows are in L1 by
   then; prefetching there cost 6-9 % at 8-256 rows with the weights in cache). Prefetches past the end of w are
   harmless (a prefetch never faults); they change no arithmetic: the same bits. -DPF_BYTES=0 builds without,
   -DPF_HINT=... with another hint (the benchmark's A/B). */
#ifndef PF_BYTES
#define PF_BYTES 12288
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif
/* rows ahead for rows of rb bytes (0: no prefetch) */
static inline long pf_rows(long rb) { return PF_BYTES > 0 ? (PF_BYTES + rb - 1) / rb : 0; }
#if PF_BYTES > 0
#define PREFETCH4(w, s, z, j, kb, ng, g) if (pfr) do {                                              \
        _mm_prefetch((const char*)((w) + ((j) + pfr) * (kb) + (g) * 16), PF_HINT);                   \
        if (!((g) & 15)) {                                                                             \
            _mm_prefetch((const char*)((s) + (long)((j) + pfr) * (ng) + (g)), PF_HINT);              \
            _mm_prefetch((const char*)((z) + (long)((j) + pfr) * (ng) + (g)), PF_HINT);              \
        } } while (0)
#define PREFETCH8(w, s, j, k, ng, g) if (pfr) do {                                                  \
        _mm_prefetch((const char*)((w) + (long)((j) + pfr) * (k) + (g) * G), PF_HINT);               \
        if (!((g) & 15)) _mm_prefetch((const char*)((s) + (long)((j) + pfr) * (ng) + (g)), PF_HINT); \
        } while (0)
#else
#define PREFETCH4(w, s, z, j, kb, ng, g) ((void)(pfr))
#define PREFETCH8(w, s, j, k, ng, g) ((void)(pfr))
#endif
#define NRM 4   /* int4: output rows per tile */
#define NRM8 2  /* int8: output rows per tile (the head at batch 1: 2 ran ~5% faster than 4 here) */
typedef __m512 acc_t[MAXM][NRM];

/* one chunk of c blocks at block g (c, the masks, NR and MT constant after inlining) */
static inline __attribute__((always_inline)) void q4_chunk(const int8_t* xq, const float* d, int k, int ng,
        const uint8_t* w, const float* s, const float* z, int NR, int MT, int g, int c, __mmask64 wm, __mmask16 sm,
        acc_t acc, long pfr) {
    static const int idx4[16] = {0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,3};
    const __m512i m4 = _mm512_set1_epi8(15), perm = _mm512_loadu_si512(idx4);
    const long kb = k / 2;
    __m512i ql[NRM], qh[NRM];
    __m512 sv[NRM];
    for (int j = 0; j < NR; j++) {
        __m512i v = _mm512_maskz_loadu_epi8(wm, w + j * kb + g * 16);
        ql[j] = _mm512_and_si512(v, m4);
        qh[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        sv[j] = _mm512_permutexvar_ps(perm, _mm512_maskz_loadu_ps(sm, s + (long)j * ng + g));
        PREFETCH4(w, s, z, j, kb, ng, g);
    }
    for (int i = 0; i < MT; i++) {
        const int8_t* x = xq + (long)i * k + g * G;
        __m512i xa = _mm512_maskz_loadu_epi8(wm, x), xb = _mm512_maskz_loadu_epi8(wm, x + 16 * c);
        __m512 dv = _mm512_permutexvar_ps(perm, _mm512_maskz_loadu_ps(sm, d + (long)i * ng + g));
        for (int j = 0; j < NR; j++) {
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ql[j], xa);
            p = _mm512_dpbusd_epi32(p, qh[j], xb);
            acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sv[j], dv), acc[i][j]);
        }
    }
}

static inline void q4_tile(const int8_t* xq, const float* d, const float* ds, int k, int ng, const uint8_t* w,
                           const float* s, const float* z, int NR, int MT, float* out, long pfr) {
    acc_t acc;
    for (int i = 0; i < MT; i++) for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    int g = 0;
    for (; g + 4 <= ng; g += 4) q4_chunk(xq, d, k, ng, w, s, z, NR, MT, g, 4, ~0ULL, 0xF, acc, pfr);  /* a full mask = a plain load */
    if (ng - g >= 2) { q4_chunk(xq, d, k, ng, w, s, z, NR, MT, g, 2, 0xFFFFFFFFULL, 0x3, acc, pfr); g += 2; }
    if (g < ng) q4_chunk(xq, d, k, ng, w, s, z, NR, MT, g, 1, 0xFFFFULL, 0x1, acc, pfr);
    for (int g = 0; g < ng; g += 16) {  /* the zero term: sum_g z[g] * ds[g] */
        const __mmask16 mk = ng - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ng - g)) - 1);
        for (int j = 0; j < NR; j++) {
            __m512 zv = _mm512_maskz_loadu_ps(mk, z + (long)j * ng + g);
            for (int i = 0; i < MT; i++)
                acc[i][j] = _mm512_fmadd_ps(zv, _mm512_maskz_loadu_ps(mk, ds + (long)i * ng + g), acc[i][j]);
        }
    }
    for (int i = 0; i < MT; i++) for (int j = 0; j < NR; j++) out[i * NRM + j] = _mm512_reduce_add_ps(acc[i][j]);
}

/* int8 weights (w + j * k, a scale per block): chunks of 2 blocks (64 bytes) and a last single block. Unsigned
   times signed: xq + 128 against the weight, minus 128 * (the weight's 4-byte sums), both by vpdpbusd (exact). */
static inline __attribute__((always_inline)) void q8_chunk(const int8_t* xq, const float* d, int k, int ng,
        const int8_t* w, const float* s, int NR, int MT, int g, __mmask64 wm, __mmask16 sm, acc_t acc, long pfr) {
    static const int idx8[16] = {0,0,0,0,0,0,0,0,1,1,1,1,1,1,1,1};
    const __m512i c128 = _mm512_set1_epi8((char)0x80), perm = _mm512_loadu_si512(idx8);
    __m512i q[NRM], corr[NRM];
    __m512 sv[NRM];
    for (int j = 0; j < NR; j++) {
        q[j] = _mm512_maskz_loadu_epi8(wm, w + (long)j * k + g * G);
        corr[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, q[j]);
        PREFETCH8(w, s, j, k, ng, g);
        sv[j] = _mm512_permutexvar_ps(perm, _mm512_maskz_loadu_ps(sm, s + (long)j * ng + g));
    }
    for (int i = 0; i < MT; i++) {
        __m512i xu = _mm512_xor_si512(_mm512_maskz_loadu_epi8(wm, xq + (long)i * k + g * G), c128);
        __m512 dv = _mm512_permutexvar_ps(perm, _mm512_maskz_loadu_ps(sm, d + (long)i * ng + g));
        for (int j = 0; j < NR; j++) {
            __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), xu, q[j]), corr[j]);
            acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sv[j], dv), acc[i][j]);
        }
    }
}

static inline void q8_tile(const int8_t* xq, const float* d, int k, int ng, const int8_t* w, const float* s,
                           int NR, int MT, float* out, long pfr) {
    acc_t acc;
    for (int i = 0; i < MT; i++) for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    int g = 0;
    for (; g + 2 <= ng; g += 2) q8_chunk(xq, d, k, ng, w, s, NR, MT, g, ~0ULL, 0x3, acc, pfr);
    if (g < ng) q8_chunk(xq, d, k, ng, w, s, NR, MT, g, 0xFFFFFFFFULL, 0x1, acc, pfr);
    for (int i = 0; i < MT; i++) for (int j = 0; j < NR; j++) out[i * NRM + j] = _mm512_reduce_add_ps(acc[i][j]);
}
""" + PORTABLE_C + r"""const char* kernel_path(void) { return PATH; }

/* xq [m, k] int8 in layout `nibble` (1: NIBBLE, 0: NATURAL), d[i, g] = amax / 127 (xq = 0 where d = 0),
   ds[i, g] = d * sum(xq) over the block. Each row is quantized on its own (threads split rows, never a row). */
static void quant_row(const void* x, int bf16, int k, int nibble, int8_t* xq, float* d, float* ds, int i) {
    int ng = k / G;
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

static void quant_rows(const void* x, int bf16, int m, int k, int nibble, int8_t* xq, float* d, float* ds,
                       int nthreads) {
    if (nthreads > 1 && (long)m * k >= PAR_MIN) {  /* no region for one thread: see TILED below */
        #pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int i = 0; i < m; i++) quant_row(x, bf16, k, nibble, xq, d, ds, i);
    } else {
        for (int i = 0; i < m; i++) quant_row(x, bf16, k, nibble, xq, d, ds, i);
    }
}

void quant_act(const void* x, int bf16, int m, int k, int nibble, int8_t* xq, float* d, float* ds) {
    quant_rows(x, bf16, m, k, nibble, xq, d, ds, 1);
}

/* Rows are processed in tiles of about TILE_BYTES of quantized activations (kept in L2 while every output row of
   the weight streams past them), and inside a tile in chunks of up to 4 rows (each chunk's accumulators stay in
   registers; the constant MT lets the compiler unroll the activation-row loop). Batch invariance: a row's
   output is computed by the same sequence of operations whatever the tile, the chunk size or the thread count
   (each row has its own accumulators; chunks only share the weight loads; the library is built with
   -ffp-contract=off so no row's scalar tail is fused differently in one unrolled copy than in another). */
#define TILE_BYTES (192 * 1024)
static inline int row_tile(int k) { int t = (TILE_BYTES / k) & ~3; return t < 4 ? 4 : t; }

/* one block of NB output rows (rb) for activation rows [t0, t1) */
#define ROW_BLOCK(CALL, NB)                                                                \
        {                                                                                  \
            int r = rb * NB, nr = n - r < NB ? n - r : NB;                          \
            for (int i0 = t0; i0 < t1; i0 += MAXM) {                                   \
                int mt = t1 - i0 < MAXM ? t1 - i0 : MAXM;                              \
                float out[MAXM * NRM];                                                 \
                if (nr == NB) {                                                       \
                    switch (mt) { case 1: CALL(NB, 1); break; case 2: CALL(NB, 2); break; \
                                  case 3: CALL(NB, 3); break; default: CALL(NB, 4); } \
                    for (int i = 0; i < mt; i++)                                       \
                        for (int j = 0; j < NB; j++) y[(long)(i0 + i) * n + r + j] = out[i * NRM + j]; \
                } else {                                                               \
                    for (int j = 0; j < nr; j++, r++) {  /* the last rows of n, one at a time */ \
                        switch (mt) { case 1: CALL(1, 1); break; case 2: CALL(1, 2); break; \
                                      case 3: CALL(1, 3); break; default: CALL(1, 4); } \
                        for (int i = 0; i < mt; i++) y[(long)(i0 + i) * n + r] = out[i * NRM]; \
                    }                                                                  \
                    r -= nr;                                                           \
                }                                                                      \
            }                                                                          \
        }

/* A call that runs on one thread opens no OpenMP region: even a one-thread region (an `if` clause that is false)
   costs ~0.3 us in libgomp, and the fused batch-1 stack (cpu_fused_decode_team) calls this ~2,400 times a token on
   64-row slices (Zen 4: 48 slices of a 3072 x 576 layer took 79 us in regions vs 63 us whole). Both loops run the
   same ROW_BLOCK: the same bits. */
#define TILED(CALL, NB)                                                                   \
    for (int t0 = 0; t0 < m; t0 += tm) {                                               \
        int t1 = m - t0 < tm ? m : t0 + tm;                                            \
        if (nthreads > 1 && (long)n * k >= PAR_MIN) {                                   \
            _Pragma("omp parallel for schedule(static) num_threads(nthreads)")          \
            for (int rb = 0; rb < (n + NB - 1) / NB; rb++) ROW_BLOCK(CALL, NB)          \
        } else {                                                                       \
            for (int rb = 0; rb < (n + NB - 1) / NB; rb++) ROW_BLOCK(CALL, NB)          \
        }                                                                              \
    }

/* y[m, n] from an activation quantized in the NIBBLE layout and int4 weights w [n, k/2], s, z [n, k/32] */
int q4a8_gemm_q(const int8_t* xq, const float* d, const float* ds, int m, int k, const uint8_t* w,
                const float* s, const float* z, int n, float* y, int nthreads) {
    if (m < 0 || k % G) return -1;
    int ng = k / G, tm = row_tile(k);
    long pfr = pf_rows(k / 2);
#define Q4(NR, MT) q4_tile(xq + (long)i0 * k, d + (long)i0 * ng, ds + (long)i0 * ng, k, ng, w + (long)r * (k / 2), \
                           s + (long)r * ng, z + (long)r * ng, NR, MT, out, i0 == t0 ? pfr : 0)
    TILED(Q4, NRM)
    return 0;
}

/* the same for int8 weights w [n, k] with a scale per block, activation in the NATURAL layout */
int q8a8_gemm_q(const int8_t* xq, const float* d, int m, int k, const int8_t* w, const float* s, int n, float* y,
                int nthreads) {
    if (m < 0 || k % G) return -1;
    int ng = k / G, tm = row_tile(k);
    long pfr = pf_rows(k);
#define Q8(NR, MT) q8_tile(xq + (long)i0 * k, d + (long)i0 * ng, k, ng, w + (long)r * k, s + (long)r * ng, NR, MT, out, \
                           i0 == t0 ? pfr : 0)
    TILED(Q8, NRM8)
    return 0;
}

#define STACK_BYTES 32768
/* quantize x (float32 or bfloat16 [m, k]) then the product: one call per linear, any number of rows; bits 4 or 8 */
int qa8_gemm(int bits, const void* x, int bf16, int m, int k, const void* w, const float* s, const float* z,
             int n, float* y, int nthreads) {
    if (k % G || m < 0) return -1;
    int ng = k / G;
    size_t need = (size_t)m * k + 2 * sizeof(float) * (size_t)m * ng + 64;
    char stack[STACK_BYTES];
    char* buf = need <= STACK_BYTES ? stack : (char*)malloc(need);
    if (!buf) return -2;
    float* d = (float*)buf;
    float* ds = d + (size_t)m * ng;
    int8_t* xq = (int8_t*)(ds + (size_t)m * ng);
    quant_rows(x, bf16, m, k, bits == 4, xq, d, ds, nthreads);
    int rc = bits == 4 ? q4a8_gemm_q(xq, d, ds, m, k, (const uint8_t*)w, s, z, n, y, nthreads)
                       : q8a8_gemm_q(xq, d, m, k, (const int8_t*)w, s, n, y, nthreads);
    if (buf != stack) free(buf);
    return rc;
}
"""
