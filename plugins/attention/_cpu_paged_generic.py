"""The portable parts of the ``cpu_paged`` C kernel: K tiles loaded transposed, tile scores and the generic task
(:mod:`._cpu_paged_kernel` splices this source into its own, after the AVX-512 parts of :mod:`._cpu_paged_avx512`).

Why a module of its own: the kernel's one file grew past 400 lines; this is the code every ISA compiles (the
compiler vectorizes it: AVX2, AVX-512, Arm), and the paths the AVX-512 tasks do not take (other head sizes, float32
queries on a bf16 cache without AVX-512 BF16) run it. What a task computes and why its rows are batch-invariant:
the comment on ``task`` below and the module docstring of :mod:`._cpu_paged_kernel`.
"""

GENERIC_SOURCE = r"""
/* n K rows of D elements, rows `stride` elements apart, transposed into dst [D][TILE] (lane t = key t) */
static inline __attribute__((always_inline)) void load_rows_t(const void* cache, int is_bf16, long first,
                                                              long stride, int n, const int D, float* dst) {
    for (int t = 0; t < n; t++) {
        if (is_bf16) {
            const uint16_t* src = (const uint16_t*)cache + first + t * stride;
            for (int j = 0; j < D; j++) dst[j * TILE + t] = bf16_to_f(src[j]);
        } else {
            const float* src = (const float*)cache + first + t * stride;
            for (int j = 0; j < D; j++) dst[j * TILE + t] = src[j];
        }
    }
}

/* the G query heads of one row against a K tile (kt [D][TILE]): p[i][t] = q_i . k_t for all TILE lanes (lanes
   past the row's keys are computed and ignored). Vectorized over the keys, each lane summing over j in four
   interleaved partial sums (j mod 4), then (s0 + s1) + (s2 + s3): a fixed order per lane, the same for every
   row and every tile */
static inline __attribute__((always_inline)) void tile_scores(const float* qs, const float* kt, const int D,
                                                              const int G, float* p) {
    for (int i = 0; i < G; i++) {
        const float* qi = qs + i * D;
        float s0[TILE], s1[TILE], s2[TILE], s3[TILE];
        #pragma omp simd
        for (int t = 0; t < TILE; t++) { s0[t] = 0.f; s1[t] = 0.f; s2[t] = 0.f; s3[t] = 0.f; }
        int j = 0;
        for (; j + 4 <= D; j += 4) {
            const float *k0 = kt + j * TILE, *k1 = k0 + TILE, *k2 = k1 + TILE, *k3 = k2 + TILE;
            float q0 = qi[j], q1 = qi[j + 1], q2 = qi[j + 2], q3 = qi[j + 3];
            #pragma omp simd
            for (int t = 0; t < TILE; t++) {
                s0[t] += q0 * k0[t]; s1[t] += q1 * k1[t]; s2[t] += q2 * k2[t]; s3[t] += q3 * k3[t];
            }
        }
        for (; j < D; j++) {
            const float* kj = kt + j * TILE;
            float qj = qi[j];
            #pragma omp simd
            for (int t = 0; t < TILE; t++) s0[t] += qj * kj[t];
        }
        #pragma omp simd
        for (int t = 0; t < TILE; t++) p[i * TILE + t] = (s0[t] + s1[t]) + (s2[t] + s3[t]);
    }
}

/* one task: query rows r0 .. r0 + nr - 1 of one request (block table `table`) and one KV head h; row r attends to
   the first lens[r] positions. D and G are constants in the specialized callers below, so the inner loops have
   fixed trip counts. Each tile of K/V rows is loaded once for all rows of the task, and every row consumes the
   tiles in the same order from position 0 with the same code, whatever other rows share its task: a row's
   result depends only on its query, its lens[r] cached positions and the tile size, never on how its prompt was
   split into chunks, found in the prefix cache, or batched (a decode row is a task of one row).
   st: scratch of nr * (2 * G * D + 2 * G) floats */
static inline __attribute__((always_inline)) void task(
        const void* q, int q_bf16, long qstride, const void* kc, const void* vc, int is_bf16, const int64_t* table,
        const int64_t* lens, long r0, int nr, int h, int nh, int kvh, const int D, const int G, int bs, float scale,
        void* out, int out_bf16, float* st) {
    float kb[TILE * D] __attribute__((aligned(64))), vb[TILE * D], p[G * TILE];
    memset(kb, 0, sizeof(float) * TILE * D);  /* lanes past a short last tile: finite, computed and ignored */
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
    int esize = is_bf16 ? 2 : 4;
    for (long t0 = 0; t0 < maxlen; t0 += TILE) {
        int nall = (int)(maxlen - t0 < TILE ? maxlen - t0 : TILE);
        if (t0 + TILE < maxlen) { /* the next tile's rows: fetched while this one computes (they lie apart) */
            long nn = maxlen - t0 - TILE < TILE ? maxlen - t0 - TILE : TILE;
            for (long t = 0; t < nn; t++) {
                long pos = t0 + TILE + t;
                long off = ((table[pos / bs] * bs + pos % bs) * tok + (long)h * D) * esize;
                for (long c = 0; c < (long)D * esize; c += 64) {
                    __builtin_prefetch((const char*)kc + off + c);
                    __builtin_prefetch((const char*)vc + off + c);
                }
            }
        }
#ifdef PAGED_AVX512
        if (!is_bf16 && D % 16 == 0) { /* float32 K: transposed with shuffles (same kb, so the same scores) */
            static const uint32_t zeros[MAX_D] __attribute__((aligned(64))) = {0};
            const uint32_t* rows[TILE];
            for (int t = 0; t < TILE; t++) {
                long pos = t0 + t;
                rows[t] = t < nall ? (const uint32_t*)((const float*)kc + (table[pos / bs] * bs + pos % bs) * tok
                                                       + (long)h * D) : zeros;
            }
            transpose_rows(rows, D, (uint32_t*)kb);
            for (int t = 0; t < nall; t++) {
                long pos = t0 + t;
                memcpy(vb + t * D, (const float*)vc + (table[pos / bs] * bs + pos % bs) * tok + (long)h * D,
                       sizeof(float) * D);
            }
        } else
#endif
        /* a tile never crosses a block when bs is a multiple of TILE; otherwise walk it slot by slot */
        for (int t = 0; t < nall;) {
            long pos = t0 + t, blk = table[pos / bs];
            int run = (int)(bs - pos % bs);
            if (run > nall - t) run = nall - t;
            long first = (blk * bs + pos % bs) * tok + (long)h * D;
            load_rows_t(kc, is_bf16, first, tok, run, D, kb + t);
            load_rows(vc, is_bf16, first, tok, run, D, vb + t * D);
            t += run;
        }
        for (int r = 0; r < nr; r++) {
            long len = lens[r0 + r];
            if (len <= t0) continue;
            int n = (int)(len - t0 < TILE ? len - t0 : TILE);
            tile_scores(qs + (long)r * G * D, kb, D, G, p);
            for (int i = 0; i < G; i++) {
                long ri = (long)r * G + i;
                float mx = m[ri];
                for (int t = 0; t < n; t++) mx = p[i * TILE + t] > mx ? p[i * TILE + t] : mx;
                float corr = 0.f, sum = 0.f;
                if (m[ri] != -FLT_MAX) exp_tile(&m[ri], mx, &corr, 1);
                exp_tile(p + i * TILE, mx, p + i * TILE, n);
                #pragma omp simd reduction(+:sum)
                for (int t = 0; t < n; t++) sum += p[i * TILE + t];
                s[ri] = s[ri] * corr + sum;
                m[ri] = mx;
                float* ai = acc + ri * D;
                #pragma omp simd
                for (int j = 0; j < D; j++) ai[j] *= corr;
                for (int t = 0; t < n; t++) {
                    float pt = p[i * TILE + t];
                    const float* vt = vb + t * D;
                    #pragma omp simd
                    for (int j = 0; j < D; j++) ai[j] += pt * vt[j];
                }
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < G; i++) {
            long ri = (long)r * G + i;
            float inv = s[ri] > 0.f ? 1.f / s[ri] : 0.f;
            store_row(out, out_bf16, ((r0 + r) * nh + h * G + i) * D, acc + ri * D, inv, D);
        }
}
"""
