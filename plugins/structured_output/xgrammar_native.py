"""xgrammar's batch fill called from C, which then opens the device gate itself: no GIL between the fill's end and
the device's go (session 14; ``OCTAVO_GRAMMAR_NATIVE_OPEN``, core/grammar_device_gate.py ``NATIVE_OPEN``, on by
default since the session's GPU A/Bs; called at the accept on the core thread, core/async_gate.py NATIVE_OPEN_INLINE).

Why (issue 11, GPU, 135M shape, batch 32): under the device gate the chain N's tokens -> accept -> fill N+1 -> open
the word is what the device's sampler of N+1 waits for. The fill's native call releases the GIL, but the word was
written by Python after it returned, so the bitmask thread first had to get the GIL back from the core thread
(update N, schedule N+2) or the runner's thread (launching N+2): the quiet H100 run of session 14 measured the fill at
0.529 ms wall for 0.413 ms of that thread's CPU. Here one ``ctypes`` call (GIL released for its whole length) runs
xgrammar's ``batch_fill_next_token_bitmask`` through tvm_ffi's C ABI (``TVMFFIFunctionCall``, the same function
object Python calls, the same arguments) and then stores the step's number into the gate word (release order: the
rows are written before the word, as the Python ``DeviceGate.open`` relies on). The Python side is left only the
statistics, off the critical path. It also drops xgrammar's per-call Python (the 32 handles re-listed each call): the
matchers go as one tvm_ffi ``Array`` built once per batch list (the engine passes the same list every steady step).

On a failed native call (a tvm_ffi error: cleared here) the word stays closed and the caller fills again through
xgrammar's Python API, which raises the library's own error or fills; the caller then opens the word in Python.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

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

/* persistent workers for chunks 1..n-1 of a call (chunk 0 runs on the caller): no thread made per call, no GIL */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    long gen;
    int stop, n, pending, rc, nworkers;
    const ffi_fns *fns;
    ffi_any *args;  /* n x 5 */
    pthread_t th[64];
} fill_pool;

typedef struct { fill_pool *p; int index; } worker_arg;

static void *worker(void *arg) {
    worker_arg *w = (worker_arg *)arg;
    fill_pool *p = w->p;
    int i = w->index;
    free(w);
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return 0; }
        seen = p->gen;
        int mine = i < p->n;
        pthread_mutex_unlock(&p->mu);
        if (!mine) continue;
        int rc = fill_one(p->fns, p->args + 5 * i);
        pthread_mutex_lock(&p->mu);
        if (rc) p->rc = rc;
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

void *octavo_fill_pool_new(int nworkers) {
    if (nworkers < 1 || nworkers > 64) return 0;
    fill_pool *p = (fill_pool *)calloc(1, sizeof(fill_pool));
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

void octavo_fill_pool_free(void *handle) {
    fill_pool *p = (fill_pool *)handle;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; ++i) pthread_join(p->th[i], 0);
    free(p);
}

/* fns: the 4 entry points; args: n x 5 views (chunk j's rows); pool: 0 or a pool with >= n - 1 workers. Returns 0 when
   every chunk filled, then word[0] = max(word[0], seq) after the rows are written (seq 0: no word); else a failed
   chunk's rc and the word untouched. *t_end: CLOCK_MONOTONIC seconds (Python's perf_counter clock on Linux). */
int octavo_fill_open(const ffi_fns *fns, ffi_any *args, int n, void *pool, int32_t *word, int32_t seq,
                     double *t_end) {
    fill_pool *p = (fill_pool *)pool;
    int rc = 0;
    if (n > 1 && p && p->nworkers >= n - 1) {
        pthread_mutex_lock(&p->mu);
        p->fns = fns;
        p->args = args;
        p->n = n;
        p->pending = n - 1;
        p->rc = 0;
        p->gen++;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
        rc = fill_one(fns, args);
        pthread_mutex_lock(&p->mu);
        while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
        if (!rc) rc = p->rc;
        pthread_mutex_unlock(&p->mu);
    } else {
        for (int j = 0; j < n && !rc; ++j) rc = fill_one(fns, args + 5 * j);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *t_end = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    if (rc == 0 && seq > 0 && __atomic_load_n(word, __ATOMIC_ACQUIRE) < seq)
        __atomic_store_n(word, seq, __ATOMIC_RELEASE);  /* after every row (the workers' writes joined above) */
    return rc;
}
"""

_state: dict[str, Any] = {}
_P = ctypes.c_void_p
# Session 14: the rows split into this many contiguous chunks, filled at once by the caller and POOL_THREADS - 1
# persistent C threads (no GIL, no thread made per call, unlike xgrammar's own pool); 1: one call on the caller.
# 4 (at most half the cores): what the s14 GPU runs measured (16-core hosts; json_async_nativeopen_p4_inline: the
# fill 0.29-0.33 ms vs 0.75-0.89 ms in Python on the bitmask thread).
POOL_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) // 2 if hasattr(os, "sched_getaffinity") else 1))
MIN_ROWS_PER_CHUNK = 4  # (a row fills in ~10-40 us; waking a worker costs ~5-20 us)


class _Any(ctypes.Structure):
    _fields_ = [("type_index", ctypes.c_int32), ("zero_padding", ctypes.c_uint32), ("v", ctypes.c_int64)]


class _Fns(ctypes.Structure):
    _fields_ = [("call", _P), ("move_error", _P), ("decref", _P), ("func", _P)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", _P), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_NONE, _BOOL, _DLTENSOR_PTR = 0, 2, 7  # tvm_ffi type indices (tvm/ffi/c_api.h TVMFFITypeIndex)


def library() -> tuple[Any, tuple[int, int, int]]:
    """The compiled shim and the three tvm_ffi C entry points it calls; raises ``RuntimeError`` with the reason
    where it cannot be built or tvm_ffi's library is not found (the caller names the switch)."""
    if "lib" not in _state:
        from octavo.plugins.quant.cpu_build import cached_library

        sig = {"octavo_fill_open": ([_P, _P, ctypes.c_int, _P, _P, ctypes.c_int32, ctypes.POINTER(ctypes.c_double)],
                                    ctypes.c_int),
               "octavo_fill_pool_new": ([ctypes.c_int], _P), "octavo_fill_pool_free": ([_P], None)}
        lib = cached_library(_state, C_SOURCE, "octavo_xgrammar_fill_open", ["-O2", "-shared", "-fPIC", "-pthread"],
                             sig)
        if lib is None:
            raise RuntimeError(f"the fill shim did not build: {_state.get('why')}")
        import tvm_ffi

        path = os.path.join(os.path.dirname(tvm_ffi.__file__), "lib", "libtvm_ffi.so")
        ffi = ctypes.CDLL(path)  # (already loaded by the import: the same handle)
        _state["entry"] = tuple(ctypes.cast(getattr(ffi, n), _P).value
                                for n in ("TVMFFIFunctionCall", "TVMFFIErrorMoveFromRaised", "TVMFFIObjectDecRef"))
    if _state["lib"] is None:
        raise RuntimeError(f"the fill shim did not build: {_state.get('why')}")
    return _state["lib"], _state["entry"]


def _object_view(handle: int) -> tuple[int, int]:
    """(type index, pointer) of a tvm_ffi object view: the type index sits after the 8-byte ref count."""
    return ctypes.c_int32.from_address(handle + 8).value, handle


class NativeFill:
    """One filling thread's native fill + open (the backend keeps one per thread, as its ``BatchGrammarMatcher``).

    Args:
        batch: that thread's ``xgrammar.BatchGrammarMatcher`` (chunk 0's; the other chunks get their own).
        threads: :data:`POOL_THREADS` when made.
    """

    def __init__(self, batch: Any, threads: int = 1) -> None:
        import xgrammar as xgr
        from tvm_ffi import core

        self.lib, entry = library()
        info = core._type_cls_to_type_info(type(batch._handle))  # noqa: SLF001 - the reflected method's Function
        fn = next(m.func for m in info.methods if m.name == "batch_fill_next_token_bitmask")
        self.fns = _Fns(*entry, fn.__chandle__())
        self.batch, self.fn, self.threads = batch, fn, threads
        self.batches = [batch] + [xgr.BatchGrammarMatcher(max_threads=1) for _ in range(threads - 1)]
        self.pool = self.lib.octavo_fill_pool_new(threads - 1) if threads > 1 else None
        if threads > 1 and not self.pool:
            raise RuntimeError(f"the fill shim could not start {threads - 1} threads")
        self._key: tuple = ()
        self._keep: tuple = ()  # the Arrays and the DLTensors' parts, alive while the args point at them
        self.args, self.n = None, 0
        self.t_end = ctypes.c_double(0.0)

    def __del__(self) -> None:
        if getattr(self, "pool", None):
            self.lib.octavo_fill_pool_free(self.pool)
            self.pool = None

    def _prepare(self, inner: list, bitmask: Any) -> None:
        import tvm_ffi

        n, words = bitmask.shape
        key = (inner, bitmask.data_ptr(), n, words, bitmask.stride(0))
        if self._key and self._key[0] is inner and self._key[1:] == key[1:]:
            return
        k = max(1, min(self.threads, len(inner) // MIN_ROWS_PER_CHUNK))
        cuts = [len(inner) * i // k for i in range(k + 1)]
        args, keep = (_Any * (5 * k))(), []
        for j, (a, b) in enumerate(zip(cuts, cuts[1:])):
            arr = tvm_ffi.convert([m._handle for m in inner[a:b]])  # noqa: SLF001
            shape = (ctypes.c_int64 * 2)(b - a, words)
            strides = (ctypes.c_int64 * 2)(bitmask.stride(0), 1)
            dl = _DLTensor(data=bitmask[a:b].data_ptr(), device_type=1, device_id=0, ndim=2, code=0, bits=32, lanes=1,
                           shape=shape, strides=strides, byte_offset=0)  # kDLCPU (pinned memory is host memory), int32
            v = args[5 * j:5 * j + 5]
            v[0].type_index, v[0].v = _object_view(self.batches[j]._handle.__chandle__())  # noqa: SLF001
            v[1].type_index, v[1].v = _object_view(arr.__chandle__())
            v[2].type_index, v[2].v = _DLTENSOR_PTR, ctypes.addressof(dl)
            v[3].type_index, v[3].v = _NONE, 0
            v[4].type_index, v[4].v = _BOOL, 0
            keep += [arr, shape, strides, dl]
        self._key, self._keep, self.args, self.n = key, (keep, self.batches), args, k

    def __call__(self, inner: list, bitmask: Any, words: Any, seq: int) -> float:
        """Fill ``bitmask[j]`` from ``inner[j]`` (xgrammar matchers, none terminated) and open ``words[0]`` to ``seq``
        (0: no word): perf_counter seconds when the fill ended, or 0.0 when the native call failed (nothing opened;
        the caller fills again through the Python API and opens the word)."""
        self._prepare(inner, bitmask)
        word = words.data_ptr() if words is not None else None
        rc = self.lib.octavo_fill_open(ctypes.byref(self.fns), self.args, self.n, self.pool, word, seq,
                                       ctypes.byref(self.t_end))
        return self.t_end.value if rc == 0 else 0.0


def self_test(threads: int = 2) -> None:
    """Fill 8 rows of a tiny grammar (a synthetic 256-token vocabulary) natively and through xgrammar's Python API and
    compare, with the word opened; raises ``RuntimeError`` saying what differs (run once where the switch is on)."""
    import torch
    import xgrammar as xgr

    info = xgr.TokenizerInfo([chr(97 + i % 26) * (1 + i // 26) for i in range(256)], vocab_size=256,
                             stop_token_ids=[25])
    matchers = [xgr.GrammarMatcher(xgr.GrammarCompiler(info, max_threads=1).compile_regex("(a|bb)+c?"))
                for _ in range(8)]
    for m, toks in zip(matchers, [[], [0], [27], [0, 2], [26], [0, 27, 0], [27, 2], [0]]):
        for t in toks:
            m.accept_token(t)
    batch = xgr.BatchGrammarMatcher(max_threads=1)
    ref, rows = torch.zeros(8, 8, dtype=torch.int32), torch.zeros(8, 8, dtype=torch.int32)
    batch.batch_fill_next_token_bitmask(matchers, ref)
    words = torch.zeros(2, dtype=torch.int32)
    t_end = NativeFill(batch, threads)(matchers, rows, words, 1)  # (8 rows: 2 chunks, the pool runs one)
    if not t_end or not torch.equal(rows, ref) or int(words[0]) != 1:
        raise RuntimeError(f"the native fill's self-test failed (returned {t_end}, rows equal "
                           f"{torch.equal(rows, ref)}, word {int(words[0])})")


def clock_matches() -> bool:
    """Whether the shim's CLOCK_MONOTONIC stamps are ``time.perf_counter`` values (Linux CPython: yes)."""
    return time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"
