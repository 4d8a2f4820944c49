"""C source of :mod:`.cpu_fused_decode`: a whole Llama decoder stack for one decode token in one C call.

Kept apart so the Python wrapper stays short. The call does, per layer, RMSNorm (+ residual) -> QKV -> rotary
(neox halves) -> K/V written into the paged cache -> attention over the paged cache -> O -> residual ->
RMSNorm -> gate_up -> SiLU-and-mul -> down; then the final RMSNorm. The linears and the attention are NOT
re-implemented here: the caller passes pointers to the existing kernels' C functions
(:mod:`octavo.plugins.quant.cpu_int8act`'s ``qa8_gemm`` and ``cpu_paged``'s ``paged_rows``, in their own
libraries with their own build flags), so a linear or an attention row computes the same bits as in the
per-op path for the same input. What differs is what lies between them: the hidden state stays float32 for
the whole stack (the per-op path rounds it to the model dtype after every op), and the norms, rotary and SiLU
are plain C loops in a fixed order.
"""

from octavo.plugins.platforms.cpu_norm import ROW_C
from octavo.plugins.platforms.cpu_sleef_src import SLEEF_EXPF16

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sched.h>
#include <omp.h>
""" + ROW_C + r"""
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPIN_PAUSE() _mm_pause()
#else
#define SPIN_PAUSE() ((void)0)
#endif

typedef int (*gemm_fn)(int bits, const void* x, int bf16, int m, int k, const void* w, const float* s,
                       const float* z, int n, float* y, int nthreads);
/* cpu_paged's paged_rows (checked against its ctypes argtypes before this library is used): the float32-query
   form of session 6 (attn_abi 0) or the strided float32/bfloat16 one (attn_abi 1) */
typedef void (*attn0_fn)(const float* q, const void* kc, const void* vc, int is_bf16, const int64_t* tables,
                         int tstride, const int64_t* row_req, const int64_t* lens, const int64_t* task_row0,
                         const int64_t* task_nrows, int ntasks, int nh, int kvh, int d, int bs, float scale,
                         float* out, int nthreads);
typedef int (*attn_fn)(const void* q, int q_bf16, long qstride, const void* kc, const void* vc, int is_bf16,
                       const int64_t* tables, int tstride, const int64_t* row_req, const int64_t* lens,
                       const int64_t* task_row0, const int64_t* task_nrows, int ntasks, int nh, int kvh, int d,
                       int bs, float scale, void* out, int out_bf16, int nthreads);

/* cpu_int8act's split form of qa8_gemm: quantize the activation, then the product on it (any slice of rows) */
typedef void (*quant_fn)(const void* x, int bf16, int m, int k, int nibble, int8_t* xq, float* d, float* ds);
typedef int (*q4q_fn)(const int8_t* xq, const float* d, const float* ds, int m, int k, const uint8_t* w,
                      const float* s, const float* z, int n, float* y, int nthreads);
typedef int (*q8q_fn)(const int8_t* xq, const float* d, int m, int k, const int8_t* w, const float* s, int n,
                      float* y, int nthreads);

/* one quantized linear: bits 4 (w uint8 [n, k/2], s, z [n, k/32]) or 8 (w int8 [n, k], s [n, k/32], z unused) */
typedef struct { int64_t bits, n, k; const void* w; const float* s; const float* z; } Lin;

typedef struct {
    const void* ln1; const void* ln2;  /* RMSNorm weights [hidden], Stack.w_bf16 */
    Lin qkv, o, gu, dn;
    void* kc; void* vc;                /* this layer's K and V caches [slots, kvh, d], Stack.kv_bf16 */
} Layer;

typedef struct {
    int64_t nlayers, hidden, nh, kvh, d, inter, bs, kv_bf16, w_bf16, embed_bf16, nthreads, attn_abi;
    double eps, scale;
    const void* embed;       /* [vocab, hidden], Stack.embed_bf16 */
    const void* final_norm;  /* [hidden], Stack.w_bf16 */
    gemm_fn gemm;
    void* attn;  /* attn0_fn or attn_fn, by attn_abi */
    const Layer* layers;
    quant_fn quant; q4q_fn q4; q8q_fn q8;  /* fused_decode_team only */
} Stack;

static inline float bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }

/* float -> bfloat16, round to nearest even (torch's .to(torch.bfloat16)); NaN stays a quiet NaN */
static inline uint16_t f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ld(const void* p, int bf16, long i) { return bf16 ? bf2f(((const uint16_t*)p)[i]) : ((const float*)p)[i]; }

/* the per-op path's norm (cpu_norm.ROW_C, included above): x in the model dtype's values */
static void rms_norm(const float* x, const void* w, int w_bf16, long n, double eps, float* out) {
    norm_row(x, w, w_bf16, n, eps, out);
}

/* SLEEF 3.x xexpf (u10) with FMA for one lane: cpu_silu's sleef_expf (torch's Vectorized<float>::exp()) */
static inline float sleef_expf1(float d) {
    if (d < -104.f) return 0.f;
    if (100.f < d) return __builtin_inff();
    int q = (int)nearbyintf(d * 1.442695040888963407359924681001892137f);
    float qf = (float)q;
    float s = fmaf(qf, -0.693145751953125f, d);
    s = fmaf(qf, -1.428606765330187045e-06f, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    int h = q >> 1;
    uint32_t b1 = (uint32_t)(h + 0x7f) << 23, b2 = (uint32_t)(q - h + 0x7f) << 23;
    float p1, p2;
    memcpy(&p1, &b1, 4); memcpy(&p2, &b2, 4);
    return (u * p1) * p2;
}

#if defined(__AVX512F__)
""" + SLEEF_EXPF16 + r"""

/* nb_rd(f, 1) on 16 lanes for non-NaN f (a NaN lane is redone by the scalar code: see silu_mul_row) */
static inline __m512 rd_bf16_16(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    u = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                         _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_srli_epi32(u, 16), 16));
}
#endif

/* cpu_silu's SiLU-and-mul (the per-op path's): silu(g) = g / (1 + exp(-g)) rounded to the model dtype, times up,
   rounded again. Vectorized (the scalar SLEEF exp was ~0.3 ms of a token's serial work on a Zen 4): 16 lanes run
   the scalar code's operations; a block with a NaN anywhere is recomputed by the scalar code (its bf16 rounding
   keeps a NaN's payload), so every bit equals the scalar form. */
static void silu_mul_row(const float* gu, long I, int md, float* act) {
    long i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= I; i += 16) {
        __m512 g = _mm512_loadu_ps(gu + i), up = _mm512_loadu_ps(gu + I + i);
        __m512 e = sleef_expf16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 sl = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
        if (md) sl = rd_bf16_16(sl);
        __m512 a = _mm512_mul_ps(sl, up);
        if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) || _mm512_cmp_ps_mask(sl, sl, _CMP_UNORD_Q)) break;
        _mm512_storeu_ps(act + i, md ? rd_bf16_16(a) : a);
    }
#endif
    for (; i < I; i++) {
        float g = gu[i];
        float sl = nb_rd(g / (1.f + sleef_expf1(0.f - g)), md);
        act[i] = nb_rd(sl * gu[I + i], md);
    }
}

/* silu_mul_row for tests (tests/quant/test_cpu_fused_silu.py) */
void fused_silu_mul(const float* gu, long I, int md, float* act) { silu_mul_row(gu, I, md, act); }

/* neox rotary on `heads` heads of d features: halves (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) */
static void rotary(float* x, long heads, long d, const float* cs, const float* sn, int md) {
    long half = d / 2;
    for (long h = 0; h < heads; h++) {
        float* v = x + h * d;
        for (long j = 0; j < half; j++) {
            float x1 = v[j], x2 = v[j + half];
            float a = x1 * cs[j], b = x2 * sn[j], e = x2 * cs[j], f = x1 * sn[j];  /* cpu_rope's order */
            v[j] = nb_rd(a - b, md);
            v[j + half] = nb_rd(e + f, md);
        }
    }
}

/* y rounded to the model dtype in place (the per-op linear returns its float32 product as the model dtype) */
static inline void rd_vec(float* y, long n, int md) { if (md) for (long i = 0; i < n; i++) y[i] = nb_rd(y[i], 1); }


/* attention of the token's q (qkv's first qn floats) -> att [qn] in the model dtype's values. A bfloat16 model
   hands paged_rows bf16 q and takes bf16 out, as the per-op path does (cpu_paged passes the query's dtype);
   qb / ab: 2 * qn uint16 scratch */
static void attend(const Stack* S, const Layer* L, const float* qkv, const int64_t* tab, long nb, int64_t len,
                   float* att, uint16_t* qb, int nthreads) {
    const long qn = S->nh * S->d, kn = S->kvh * S->d;
    const int md = (int)S->w_bf16;
    int64_t zero = 0, one = 1, lens = len;
    uint16_t* ab = qb + qn;
    if (S->attn_abi && md) {
        for (long i = 0; i < qn; i++) qb[i] = f2bf(qkv[i]);
        ((attn_fn)S->attn)(qb, 1, qn, L->kc, L->vc, (int)S->kv_bf16, tab, (int)nb, &zero, &lens, &zero, &one, 1,
                           (int)S->nh, (int)S->kvh, (int)S->d, (int)S->bs, (float)S->scale, ab, 1, nthreads);
        for (long i = 0; i < qn; i++) att[i] = bf2f(ab[i]);
    } else if (S->attn_abi) {
        ((attn_fn)S->attn)(qkv, 0, qn + 2 * kn, L->kc, L->vc, (int)S->kv_bf16, tab, (int)nb, &zero, &lens, &zero,
                           &one, 1, (int)S->nh, (int)S->kvh, (int)S->d, (int)S->bs, (float)S->scale, att, 0, nthreads);
    } else {
        ((attn0_fn)S->attn)(qkv, L->kc, L->vc, (int)S->kv_bf16, tab, (int)nb, &zero, &lens, &zero, &one, 1,
                            (int)S->nh, (int)S->kvh, (int)S->d, (int)S->bs, (float)S->scale, att, nthreads);
        rd_vec(att, qn, md);
    }
}

static inline int lin(const Stack* S, const Lin* L, const float* x, float* y) {
    return S->gemm((int)L->bits, x, 0, 1, (int)L->k, L->w, L->s, L->z, (int)L->n, y, (int)S->nthreads);
}

/* One decode token through every layer. token: its id; cs / sn: the rotary cos / sin rows of its position
   (d / 2 floats each); slot: the cache slot its K/V go to; table: the request's block ids (int32 or int64,
   table_i64), at least ceil(len / bs) of them; len: the positions it attends to (its own included).
   out: the final-normed hidden state [hidden] in float32. Returns 0, or a negative code. */
int fused_decode(const Stack* S, int64_t token, const float* cs, const float* sn, int64_t slot,
                 const void* table, int table_i64, int64_t len, float* out) {
    const long H = S->hidden, nh = S->nh, kvh = S->kvh, d = S->d, I = S->inter;
    const long qn = nh * d, kn = kvh * d, nb = (len + S->bs - 1) / S->bs;
    const int wb = (int)S->w_bf16, md = wb;
    float* buf = (float*)malloc(sizeof(float) * (size_t)(3 * H + qn + 2 * kn + qn + 2 * I + I + qn) + sizeof(int64_t) * (size_t)(nb + 1));
    if (!buf) return -2;
    float *r = buf, *h = r + H, *t = h + H, *qkv = t + H, *att = qkv + qn + 2 * kn, *gu = att + qn, *act = gu + 2 * I;
    uint16_t* qb = (uint16_t*)(act + I);
    int64_t* tab = (int64_t*)(act + I + qn);
    for (long b = 0; b < nb; b++) tab[b] = table_i64 ? ((const int64_t*)table)[b] : (int64_t)((const int32_t*)table)[b];
    int rc = 0;
    for (long i = 0; i < H; i++) r[i] = nb_rd(ld(S->embed, (int)S->embed_bf16, token * H + i), md);
    for (long l = 0; l < S->nlayers && !rc; l++) {
        const Layer* L = S->layers + l;
        if (l) for (long i = 0; i < H; i++) r[i] = nb_rd(r[i] + t[i], md);
        rms_norm(r, L->ln1, wb, H, S->eps, h);
        rc |= lin(S, &L->qkv, h, qkv);
        rd_vec(qkv, qn + 2 * kn, md);
        rotary(qkv, nh, d, cs, sn, md);
        rotary(qkv + qn, kvh, d, cs, sn, md);
        const float *k = qkv + qn, *v = k + kn;
        if (S->kv_bf16) {
            uint16_t *kc = (uint16_t*)L->kc + slot * kn, *vc = (uint16_t*)L->vc + slot * kn;
            for (long i = 0; i < kn; i++) { kc[i] = f2bf(k[i]); vc[i] = f2bf(v[i]); }
        } else {
            memcpy((float*)L->kc + slot * kn, k, sizeof(float) * kn);
            memcpy((float*)L->vc + slot * kn, v, sizeof(float) * kn);
        }
        attend(S, L, qkv, tab, nb, len, att, qb, (int)S->nthreads);
        rc |= lin(S, &L->o, att, t);
        rd_vec(t, H, md);
        for (long i = 0; i < H; i++) r[i] = nb_rd(r[i] + t[i], md);
        rms_norm(r, L->ln2, wb, H, S->eps, h);
        rc |= lin(S, &L->gu, h, gu);
        rd_vec(gu, 2 * I, md);
        silu_mul_row(gu, I, md, act);
        rc |= lin(S, &L->dn, act, t);
        rd_vec(t, H, md);
    }
    if (!rc) {
        for (long i = 0; i < H; i++) r[i] = nb_rd(r[i] + t[i], md);
        rms_norm(r, S->final_norm, wb, H, S->eps, out);
    }
    free(buf);
    return rc ? -1 : 0;
}

/* A barrier of the team of fused_decode_team: spin (pause) while the others are close, then yield the core, so a
   thread waiting for a descheduled sibling on a busy machine gives its core away instead of sleeping in a futex
   (libgomp's own barriers and region ends sleep after a short spin: ~150 of them per token cost more than the
   work at 2 threads on a loaded 2-CPU VM). Release / acquire order: every write before the barrier is seen after it. */
typedef struct { int count, gen; } Bar;
static void bar_wait(Bar* b, int n) {
    if (n == 1) return;
    int g = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, g + 1, __ATOMIC_RELEASE);
        return;
    }
    for (long spins = 0; __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == g; spins++) {
        if (spins < 20000) SPIN_PAUSE(); else sched_yield();
    }
}

/* rows [r0, r1) of a linear on the quantized x, through cpu_int8act's product with one thread */
static int lin_rows(const Stack* S, const Lin* L, const int8_t* xq, const float* d, const float* ds, float* y,
                    long r0, long r1) {
    long ng = L->k / 32;
    if (L->bits == 4)
        return S->q4(xq, d, ds, 1, (int)L->k, (const uint8_t*)L->w + r0 * (L->k / 2), L->s + r0 * ng, L->z + r0 * ng,
                     (int)(r1 - r0), y + r0, 1);
    return S->q8(xq, d, 1, (int)L->k, (const int8_t*)L->w + r0 * L->k, L->s + r0 * ng, (int)(r1 - r0), y + r0, 1);
}

#ifndef PIECES
#define PIECES 1  /* chunks per thread and linear */
#endif
/* the team's rows of one linear (nth threads) in chunks of ~n / (nth * PIECES) rows (a multiple of the row tile, 4)
   from the shared counter *next (zero before the phase): a thread that starts late (descheduled) takes what is left.
   Long chunks: a thread's rows are one stream the kernels' prefetch runs ahead in (2 threads, Zen 4, the stack per
   token: 64-row chunks 6.2 ms, 256-row 4.6; PIECES 1 / 2 / 3 / 6: 3.9 / 4.3 / 4.9 / 5.6). Same bits any way. */
static int lin_team(const Stack* S, const Lin* L, const int8_t* xq, const float* d, const float* ds, float* y,
                    long* next, int nth) {
    int rc = 0;
    const long per = (long)nth * PIECES, ch = ((L->n + per - 1) / per + 3) & ~3L;
    for (long r0; (r0 = __atomic_fetch_add(next, ch, __ATOMIC_RELAXED)) < L->n;)
        rc |= lin_rows(S, L, xq, d, ds, y, r0, r0 + ch < L->n ? r0 + ch : L->n);
    return rc;
}

/* fused_decode with ONE OpenMP region for the whole token (nthreads threads): the output rows of every linear are
   shared by the threads in chunks (each through cpu_int8act's q4a8_gemm_q / q8a8_gemm_q with one thread, on the
   activation quantized once by its quant_act: the same per-row arithmetic as qa8_gemm, so the same bits as
   fused_decode at any thread count); thread 0 alone runs the norms, rotary, K/V write, attention (paged_rows, one
   thread) and SiLU between Bar barriers. 8 barriers per layer and one region, instead of 5 regions per layer. */
int fused_decode_team(const Stack* S, int64_t token, const float* cs, const float* sn, int64_t slot,
                      const void* table, int table_i64, int64_t len, float* out) {
    const long H = S->hidden, nh = S->nh, kvh = S->kvh, d = S->d, I = S->inter;
    const long qn = nh * d, kn = kvh * d, nb = (len + S->bs - 1) / S->bs, kmax = I > qn ? (I > H ? I : H) : (qn > H ? qn : H);
    const int wb = (int)S->w_bf16, md = wb;
    size_t nf = (size_t)(3 * H + qn + 2 * kn + qn + 2 * I + I + 2 * (kmax / 32 + 1) + qn);
    float* buf = (float*)malloc(sizeof(float) * nf + sizeof(int64_t) * (size_t)(nb + 1) + (size_t)kmax + 64);
    long* next = (long*)calloc((size_t)(4 * S->nlayers), sizeof(long));  /* one row counter per linear */
    if (!buf || !next) { free(buf); free(next); return -2; }
    float *r = buf, *h = r + H, *t = h + H, *qkv = t + H, *att = qkv + qn + 2 * kn, *gu = att + qn, *act = gu + 2 * I;
    float *qd = act + I, *qds = qd + kmax / 32 + 1;
    uint16_t* qb = (uint16_t*)(qds + kmax / 32 + 1);
    int64_t* tab = (int64_t*)(buf + nf);
    int8_t* xq = (int8_t*)(tab + nb + 1);
    for (long b = 0; b < nb; b++) tab[b] = table_i64 ? ((const int64_t*)table)[b] : (int64_t)((const int32_t*)table)[b];
    int rc = 0;
    Bar bar = {0, 0};
    for (long i = 0; i < H; i++) r[i] = nb_rd(ld(S->embed, (int)S->embed_bf16, token * H + i), md);
    #pragma omp parallel num_threads((int)S->nthreads) if (S->nthreads > 1)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int my = 0;
        for (long l = 0; l < S->nlayers; l++) {
            const Layer* L = S->layers + l;
            if (tid == 0) {
                if (l) for (long i = 0; i < H; i++) r[i] = nb_rd(r[i] + t[i], md);
                rms_norm(r, L->ln1, wb, H, S->eps, h);
                S->quant(h, 0, 1, (int)H, L->qkv.bits == 4, xq, qd, qds);
            }
            bar_wait(&bar, nth);
            my |= lin_team(S, &L->qkv, xq, qd, qds, qkv, next + 4 * l + 0, nth);
            bar_wait(&bar, nth);
            if (tid == 0) {
                rd_vec(qkv, qn + 2 * kn, md);
                rotary(qkv, nh, d, cs, sn, md);
                rotary(qkv + qn, kvh, d, cs, sn, md);
                const float *k = qkv + qn, *v = k + kn;
                if (S->kv_bf16) {
                    uint16_t *kc = (uint16_t*)L->kc + slot * kn, *vc = (uint16_t*)L->vc + slot * kn;
                    for (long i = 0; i < kn; i++) { kc[i] = f2bf(k[i]); vc[i] = f2bf(v[i]); }
                } else {
                    memcpy((float*)L->kc + slot * kn, k, sizeof(float) * kn);
                    memcpy((float*)L->vc + slot * kn, v, sizeof(float) * kn);
                }
                attend(S, L, qkv, tab, nb, len, att, qb, 1);
                S->quant(att, 0, 1, (int)qn, L->o.bits == 4, xq, qd, qds);
            }
            bar_wait(&bar, nth);
            my |= lin_team(S, &L->o, xq, qd, qds, t, next + 4 * l + 1, nth);
            bar_wait(&bar, nth);
            if (tid == 0) {
                rd_vec(t, H, md);
                for (long i = 0; i < H; i++) r[i] = nb_rd(r[i] + t[i], md);
                rms_norm(r, L->ln2, wb, H, S->eps, h);
                S->quant(h, 0, 1, (int)H, L->gu.bits == 4, xq, qd, qds);
            }
            bar_wait(&bar, nth);
            my |= lin_team(S, &L->gu, xq, qd, qds, gu, next + 4 * l + 2, nth);
            bar_wait(&bar, nth);
            if (tid == 0) {
                rd_vec(gu, 2 * I, md);
                silu_mul_row(gu, I, md, act);
                S->quant(act, 0, 1, (int)I, L->dn.bits == 4, xq, qd, qds);
            }
            bar_wait(&bar, nth);
            my |= lin_team(S, &L->dn, xq, qd, qds, t, next + 4 * l + 3, nth);
            bar_wait(&bar, nth);
            if (tid == 0) rd_vec(t, H, md);
        }
        if (my) {
            #pragma omp atomic write
            rc = 1;
        }
    }
    if (!rc) {
        for (long i = 0; i < H; i++) r[i] = nb_rd(r[i] + t[i], md);
        rms_norm(r, S->final_norm, wb, H, S->eps, out);
    }
    free(buf);
    free(next);
    return rc ? -1 : 0;
}
"""
