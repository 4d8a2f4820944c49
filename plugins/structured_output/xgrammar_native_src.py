"""The C shim of plugins/structured_output/xgrammar_native.py (its own file: the C text is long, the Python short).

xgrammar's ``batch_fill_next_token_bitmask`` (and, session 15, each row's ``accept_token`` first) called through
tvm_ffi's C ABI with the GIL released, over the caller and persistent pthreads, then the device gate's word stored
with release order after every row. Session 15 adds a call that hands every chunk to the workers and returns at once
(``octavo_fill_open_start``; the last chunk opens the word) and its join. Why each part exists: the Python module's
docstring and docs/performance.md (structured outputs, sessions 14-15).
"""

C_SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct { int32_t type_index; uint32_t zero_padding; union { int64_t v_int64; void *v_ptr; double v_f; } v; }
    ffi_any;
typedef int (*ffi_call_t)(void *func, ffi_any *args, int32_t num_args, ffi_any *result);
typedef void (*ffi_move_error_t)(void **result);
typedef int (*ffi_decref_t)(void *obj);

typedef struct {  /* the tvm_ffi entry points and the fill method */
    ffi_call_t call; ffi_move_error_t move_error; ffi_decref_t decref; void *func;
} ffi_fns;

/* one fill call: args = the 5 views Python prepared (self, matchers Array, DLTensor* rows, None, false) */
static int fill_one(const ffi_fns *f, ffi_any *args) {
    ffi_any result;
    result.type_index = 0;
    result.zero_padding = 0;
    result.v.v_int64 = 0;
    int rc = f->call(f->func, args, 5, &result);
    if (rc == 0) {
        if (result.type_index >= 64 && result.v.v_ptr) f->decref(result.v.v_ptr);  /* (the method returns None) */
    } else {  /* the error sits in this thread's slot: clear it (the caller refills through Python) */
        void *err = 0;
        f->move_error(&err);
        if (err) f->decref(err);
    }
    return rc;
}

/* session 15: a chunk's rows may accept their tokens first (the same matcher, then its row filled): xgrammar's
   GrammarMatcher.accept_token method per row, results in ok[] (1 accepted, 0 refused, 2 the call failed) */
typedef struct {
    void *fn; ffi_any *mviews; const int32_t *tokens; int8_t *ok; const int32_t *cuts;
    void *term_fn; int8_t *term;  /* session 16 (the chained fill): GrammarMatcher.is_terminated, and per row 1 when
                                     the row's matcher terminated (then its chunk is not filled: xgrammar refuses a
                                     terminated matcher's mask, and the host fills that step in Python) */
} accept_job;

/* session 16: after a chunk's accepts, each accepted row's terminated flag; -2 where any row terminated or an accept
   call failed (the chunk is left unfilled, the word stays closed, the host finishes the step) */
static int chunk_terminated(const ffi_fns *f, const accept_job *acc, int j) {
    int bad = 0;
    for (int r = acc->cuts[j]; r < acc->cuts[j + 1]; ++r) {
        acc->term[r] = 0;
        if (acc->ok[r] == 2) { bad = 1; continue; }
        ffi_any a[1], res;
        a[0] = acc->mviews[r];
        res.type_index = 0; res.zero_padding = 0; res.v.v_int64 = 0;
        if (f->call(acc->term_fn, a, 1, &res) == 0) {
            if (res.v.v_int64) { acc->term[r] = 1; bad = 1; }
            if (res.type_index >= 64 && res.v.v_ptr) f->decref(res.v.v_ptr);
        } else {
            void *err = 0;
            f->move_error(&err);
            if (err) f->decref(err);
            acc->ok[r] = 2;
            bad = 1;
        }
    }
    return bad ? -2 : 0;
}

static int run_chunk(const ffi_fns *f, ffi_any *args, const accept_job *acc, int j) {
    if (acc) {
        for (int r = acc->cuts[j]; r < acc->cuts[j + 1]; ++r) {
            ffi_any a[3], res;
            a[0] = acc->mviews[r];
            a[1].type_index = 1; a[1].zero_padding = 0; a[1].v.v_int64 = acc->tokens[r];  /* kTVMFFIInt */
            a[2].type_index = 2; a[2].zero_padding = 0; a[2].v.v_int64 = 0;  /* kTVMFFIBool: no debug print */
            res.type_index = 0; res.zero_padding = 0; res.v.v_int64 = 0;
            if (f->call(acc->fn, a, 3, &res) == 0) {
                acc->ok[r] = res.v.v_int64 ? 1 : 0;
                if (res.type_index >= 64 && res.v.v_ptr) f->decref(res.v.v_ptr);
            } else {
                void *err = 0;
                f->move_error(&err);
                if (err) f->decref(err);
                acc->ok[r] = 2;
            }
        }
        if (acc->term_fn && chunk_terminated(f, acc, j)) return -2;
    }
    return fill_one(f, args + 5 * j);
}

/* persistent workers: chunks 1..n-1 of a waited call (chunk 0 runs on the caller), or every chunk of a started one
   (shift 1: worker i runs chunk i - 1, the last one to finish opens the word); no thread made per call, no GIL */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    long gen;
    int stop, n, pending, rc, nworkers, shift;
    double spin_s;  /* session 15: an idle worker first polls for the next call this long, then sleeps */
    const ffi_fns *fns;
    ffi_any *args;  /* n x 5 */
    const accept_job *acc;
    int32_t *word;  /* a started call's word, seq and end stamp */
    int32_t seq;
    double t_end;
    pthread_t th[64];
} fill_pool;

typedef struct { fill_pool *p; int index; } worker_arg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void open_word(int32_t *word, int32_t seq) {  /* after every row (the workers' writes joined before) */
    if (word && seq > 0 && __atomic_load_n(word, __ATOMIC_ACQUIRE) < seq) __atomic_store_n(word, seq, __ATOMIC_RELEASE);
}

static void *worker(void *arg) {
    worker_arg *w = (worker_arg *)arg;
    fill_pool *p = w->p;
    int i = w->index;
    free(w);
    long seen = 0;
    for (;;) {
        if (p->spin_s > 0) {  /* a sleeping thread takes ~0.05-0.2 ms to wake (futex + the core's idle state) */
            double t0 = now_s();
            while (__atomic_load_n(&p->gen, __ATOMIC_ACQUIRE) == seen && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)
                   && now_s() - t0 < p->spin_s) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
        }
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return 0; }
        seen = p->gen;
        int j = i - p->shift;
        int mine = j >= 0 && j < p->n;
        pthread_mutex_unlock(&p->mu);
        if (!mine) continue;
        int rc = run_chunk(p->fns, p->args, p->acc, j);
        pthread_mutex_lock(&p->mu);
        if (rc) p->rc = rc;
        if (--p->pending == 0) {
            if (p->shift) {  /* a started call: its last chunk stamps the end and opens the word */
                p->t_end = now_s();
                if (!p->rc) open_word(p->word, p->seq);
            }
            pthread_cond_broadcast(&p->done);
        }
        pthread_mutex_unlock(&p->mu);
    }
}

void *octavo_fill_pool_new(int nworkers, double spin_s) {
    if (nworkers < 1 || nworkers > 64) return 0;
    fill_pool *p = (fill_pool *)calloc(1, sizeof(fill_pool));
    p->spin_s = spin_s;
    pthread_mutex_init(&p->mu, 0);
    pthread_cond_init(&p->go, 0);
    pthread_cond_init(&p->done, 0);
    for (int i = 0; i < nworkers; ++i) {
        worker_arg *w = (worker_arg *)malloc(sizeof(worker_arg));
        w->p = p;
        w->index = i + 1;
        if (pthread_create(&p->th[i], 0, worker, w)) { free(w); break; }
        p->nworkers = i + 1;
    }
    return p;
}

static void wait_idle(fill_pool *p) {  /* (caller holds mu) */
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
}

void octavo_fill_pool_free(void *handle) {
    fill_pool *p = (fill_pool *)handle;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    wait_idle(p);  /* a started call finishes first (its rows and matchers are alive until then) */
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; ++i) pthread_join(p->th[i], 0);
    free(p);
}

/* Hands a call's chunks to the pool's workers: with shift 0 workers 1..n-1 take chunks 1..n-1 (the caller runs chunk 0
   and waits), with shift 1 workers 1..n take chunks 0..n-1 and the last one to finish opens ``word`` (a started call). */
static void post(fill_pool *p, const ffi_fns *fns, ffi_any *args, const accept_job *acc, int n, int shift,
                 int32_t *word, int32_t seq) {
    pthread_mutex_lock(&p->mu);
    wait_idle(p);
    p->fns = fns;
    p->args = args;
    p->acc = acc;
    p->n = n;
    p->shift = shift;
    if (shift) {
        p->word = word;
        p->seq = seq;
    }
    p->pending = shift ? n : n - 1;
    p->rc = 0;
    __atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
}

/* fns: the 4 entry points; args: n x 5 views (chunk j's rows); pool: 0 or a pool with >= n - 1 workers; acc: 0 or
   each chunk's rows' accept first. Returns 0 when every chunk filled, then word[0] = max(word[0], seq) after the rows
   are written (seq 0: no word); else a failed chunk's rc and the word untouched. *t_end: CLOCK_MONOTONIC seconds
   (Python's perf_counter clock on Linux). */
int octavo_fill_open(const ffi_fns *fns, ffi_any *args, int n, void *pool, int32_t *word, int32_t seq,
                     double *t_end, const accept_job *acc) {
    fill_pool *p = (fill_pool *)pool;
    int rc = 0;
    if (n > 1 && p && p->nworkers >= n - 1) {
        post(p, fns, args, acc, n, 0, 0, 0);  /* chunks 1..n-1 to the workers; chunk 0 here */
        rc = run_chunk(fns, args, acc, 0);
        pthread_mutex_lock(&p->mu);
        wait_idle(p);
        if (!rc) rc = p->rc;
        pthread_mutex_unlock(&p->mu);
    } else {
        for (int j = 0; j < n; ++j) {
            int r = run_chunk(fns, args, acc, j);  /* (every chunk's accept runs even after a failed fill) */
            if (r && !rc) rc = r;
        }
    }
    *t_end = now_s();
    if (rc == 0) open_word(word, seq);
    return rc;
}

/* session 15: the same fill (and accept) handed to the pool's workers, every chunk, and not waited for: returns 0
   once queued (-1: no pool of >= n workers); the last chunk opens the word. The caller must call octavo_fill_join
   before it touches the matchers, the rows or the args again. */
int octavo_fill_open_start(const ffi_fns *fns, ffi_any *args, int n, void *pool, int32_t *word, int32_t seq,
                           const accept_job *acc) {
    fill_pool *p = (fill_pool *)pool;
    if (!p || n < 1 || p->nworkers < n) return -1;
    post(p, fns, args, acc, n, 1, word, seq);  /* every chunk to the workers */
    return 0;
}

int octavo_fill_done(void *pool) {  /* 1: no started call pending (octavo_fill_join returns at once) */
    fill_pool *p = (fill_pool *)pool;
    pthread_mutex_lock(&p->mu);
    int done = p->pending == 0;
    pthread_mutex_unlock(&p->mu);
    return done;
}

int octavo_fill_join(void *pool, double *t_end) {  /* a started call's rc (0: filled, the word opened) and end */
    fill_pool *p = (fill_pool *)pool;
    pthread_mutex_lock(&p->mu);
    wait_idle(p);
    int rc = p->rc;
    *t_end = p->t_end;
    p->shift = 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Session 16 (the chained fill, core/grammar_chain.py): step N+1's accept of N's tokens + fill + open, run by the
   CUDA driver as a host function (cuLaunchHostFunc) on a side stream once N's sampled ids are in pinned host memory,
   so no Python runs between N's tokens and N+1's mask. Never calls CUDA. state: 0 queued, 1 filled and the word
   opened, 2 left for the host (a row terminated, an accept or a fill failed: the word stays closed, the host fills
   in Python and opens it). */
typedef struct {
    const ffi_fns *fns; ffi_any *args; int n; void *pool;
    accept_job acc;           /* its tokens / ok / term arrays are this job's own */
    const void *sampled;      /* N's sampled ids on the host: int64 (bits 64) or int32 */
    const int32_t *index;     /* row r's token is sampled[index[r]]; 0: sampled[r] */
    int32_t rows, bits;
    int32_t *word; int32_t seq;
    int32_t rc, state;
    double t_run, t_end;
} chain_job;

void octavo_chain_run(void *arg) {
    chain_job *j = (chain_job *)arg;
    j->t_run = now_s();
    int32_t *tokens = (int32_t *)j->acc.tokens;
    for (int r = 0; r < j->rows; ++r) {
        int k = j->index ? j->index[r] : r;
        tokens[r] = j->bits == 64 ? (int32_t)((const int64_t *)j->sampled)[k] : ((const int32_t *)j->sampled)[k];
    }
    double t_end = 0;
    j->rc = octavo_fill_open(j->fns, j->args, j->n, j->pool, j->word, j->seq, &t_end, &j->acc);
    j->t_end = t_end;
    __atomic_store_n(&j->state, j->rc == 0 ? 1 : 2, __ATOMIC_RELEASE);
}

void *octavo_chain_fn(void) { return (void *)octavo_chain_run; }  /* (the CUhostFn's address for the launch) */

/* the job's state once it is not 0, waiting at most timeout_s (0: the state now) */
int octavo_chain_wait(chain_job *j, double timeout_s) {
    int s = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
    if (s || timeout_s <= 0) return s;
    double t0 = now_s();
    struct timespec ts = {0, 20000};
    while (!(s = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE)) && now_s() - t0 < timeout_s) nanosleep(&ts, 0);
    return s;
}
"""
