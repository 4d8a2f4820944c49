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

from octavo.env_flags import env_float
from octavo.plugins.structured_output.xgrammar_native_src import C_SOURCE

_state: dict[str, Any] = {}
_P = ctypes.c_void_p
# Session 14: the rows split into this many contiguous chunks, filled at once by the caller and POOL_THREADS - 1
# persistent C threads (no GIL, no thread made per call, unlike xgrammar's own pool); 1: one call on the caller.
# 4 (at most half the cores): what the s14 GPU runs measured (16-core hosts; json_async_nativeopen_p4_inline: the
# fill 0.29-0.33 ms vs 0.75-0.89 ms in Python on the bitmask thread).
POOL_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) // 2 if hasattr(os, "sched_getaffinity") else 1))
MIN_ROWS_PER_CHUNK = 4  # (a row fills in ~10-40 us; waking a worker costs ~5-20 us)
# Session 15, opt-in (OCTAVO_GRAMMAR_NATIVE_SPIN_US, microseconds): a worker that finished a chunk polls for the next
# call this long before it sleeps on its condition variable. Why: on the s15 call-1 H200 host the 4 C threads used
# 0.36 ms of CPU for a 0.24 ms fill of 32 rows (~0.06 ms of work a chunk): waking a sleeping thread is much of it. A
# poll as long as a step (~1 ms) keeps POOL_THREADS - 1 (started: POOL_THREADS) cores busy. 0: sleep at once.
SPIN_US = env_float("OCTAVO_GRAMMAR_NATIVE_SPIN_US", 0.0, minimum=0.0)


class _Any(ctypes.Structure):
    _fields_ = [("type_index", ctypes.c_int32), ("zero_padding", ctypes.c_uint32), ("v", ctypes.c_int64)]


class _Fns(ctypes.Structure):
    _fields_ = [("call", _P), ("move_error", _P), ("decref", _P), ("func", _P)]


class _Accept(ctypes.Structure):  # the C accept_job: each row's accept before its chunk's fill (session 15)
    _fields_ = [("fn", _P), ("mviews", _P), ("tokens", _P), ("ok", _P), ("cuts", _P),
                ("term_fn", _P), ("term", _P)]  # (session 16's chained fill: xgrammar_chain.py)


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", _P), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_NONE, _BOOL, _DLTENSOR_PTR = 0, 2, 7  # tvm_ffi type indices (tvm/ffi/c_api.h TVMFFITypeIndex)
_DBL = ctypes.POINTER(ctypes.c_double)


def library() -> tuple[Any, tuple[int, int, int]]:
    """The compiled shim and the three tvm_ffi C entry points it calls; raises ``RuntimeError`` with the reason
    where it cannot be built or tvm_ffi's library is not found (the caller names the switch)."""
    if "lib" not in _state:
        from octavo.plugins.quant.cpu_build import cached_library

        sig = {"octavo_fill_open": ([_P, _P, ctypes.c_int, _P, _P, ctypes.c_int32, _DBL, _P], ctypes.c_int),
               "octavo_fill_join": ([_P, _DBL], ctypes.c_int),
               "octavo_fill_pool_new": ([ctypes.c_int, ctypes.c_double], _P), "octavo_fill_pool_free": ([_P], None),
               "octavo_chain_run": ([_P], None), "octavo_chain_fn": ([], _P),
               "octavo_chain_wait": ([_P, ctypes.c_double], ctypes.c_int)}
        lib = cached_library(_state, C_SOURCE, "octavo_xgrammar_fill_open16", ["-O2", "-shared", "-fPIC", "-pthread"],
                             sig)
        if lib is None:
            raise RuntimeError(f"the fill shim did not build: {_state.get('why')}")
        # the calls that never block (queue a started fill, ask whether it is over, join one that is): through a
        # PyDLL handle, which keeps the GIL: a ctypes call that releases it makes this thread queue for it again
        # behind the runner's thread (up to the switch interval) for a call of a few microseconds
        gil = ctypes.PyDLL(lib._name)  # noqa: SLF001 - (the same file: dlopen returns the same handle)
        for name, argtypes in (("octavo_fill_open_start", [_P, _P, ctypes.c_int, _P, _P, ctypes.c_int32, _P]),
                               ("octavo_fill_done", [_P]), ("octavo_fill_join", [_P, _DBL]),
                               ("octavo_chain_wait", [_P, ctypes.c_double])):
            fn = getattr(gil, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        _state["gil"] = gil
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


def _method(handle: Any, name: str) -> Any:
    """The reflected tvm_ffi ``Function`` of method ``name`` on ``handle``'s type (what xgrammar's Python calls)."""
    from tvm_ffi import core

    info = core._type_cls_to_type_info(type(handle))  # noqa: SLF001
    return next(m.func for m in info.methods if m.name == name)


class NativeFill:
    """One filling thread's native fill + open (the backend keeps one per thread, as its ``BatchGrammarMatcher``).

    Args:
        batch: that thread's ``xgrammar.BatchGrammarMatcher`` (chunk 0's; the other chunks get their own).
        threads: :data:`POOL_THREADS` when made.
        started: session 15: fills are handed to the pool and not waited for (:meth:`start`, :meth:`join`): then
            ``threads`` workers, every chunk on one, none on the caller; else ``threads - 1`` and :meth:`__call__`.
    """

    def __init__(self, batch: Any, threads: int = 1, started: bool = False) -> None:
        import xgrammar as xgr

        self.lib, entry = library()
        self.gil = _state["gil"]
        fn = _method(batch._handle, "batch_fill_next_token_bitmask")  # noqa: SLF001
        self.fns = _Fns(*entry, fn.__chandle__())
        self.batch, self.fn, self.threads, self.started = batch, fn, threads, started
        self.batches = [batch] + [xgr.BatchGrammarMatcher(max_threads=1) for _ in range(threads - 1)]
        workers = threads if started else threads - 1
        self.spin_us = SPIN_US
        self.pool = self.lib.octavo_fill_pool_new(workers, SPIN_US * 1e-6) if workers > 0 else None
        if workers > 0 and not self.pool:
            raise RuntimeError(f"the fill shim could not start {workers} threads")
        self._key: tuple = ()
        self._keep: tuple = ()  # the Arrays, the DLTensors' parts and the rows, alive while the args point at them
        self.args, self.n = None, 0
        self.t_end = ctypes.c_double(0.0)
        self.acc, self.tokens, self.ok, self.accept_fn = None, None, None, None
        self.pending = False  # a started fill not joined yet

    def __del__(self) -> None:
        if getattr(self, "pool", None):
            self.lib.octavo_fill_pool_free(self.pool)  # (waits for a started fill first)
            self.pool = None

    def _prepare(self, inner: list, bitmask: Any) -> None:
        import tvm_ffi

        n, words = bitmask.shape
        key = (inner, bitmask.data_ptr(), n, words, bitmask.stride(0))
        if self._key and self._key[0] is inner and self._key[1:] == key[1:]:
            return
        if self.pending:
            self.join()  # (never here in the engine: it joins before the matchers move again)
        k = max(1, min(self.threads, len(inner) // MIN_ROWS_PER_CHUNK))
        cuts = [len(inner) * i // k for i in range(k + 1)]
        args, keep = (_Any * (5 * k))(), [bitmask]
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
        # each row's matcher as a view for its accept (the Arrays above hold the matchers alive)
        mviews = (_Any * len(inner))()
        for r, m in enumerate(inner):
            mviews[r].type_index, mviews[r].v = _object_view(m._handle.__chandle__())  # noqa: SLF001
        if self.accept_fn is None and inner:
            self.accept_fn = _method(inner[0]._handle, "accept_token")  # noqa: SLF001
        self.tokens, self.ok = (ctypes.c_int32 * len(inner))(), (ctypes.c_int8 * len(inner))()
        c_cuts = (ctypes.c_int32 * (k + 1))(*cuts)
        self.acc = _Accept(self.accept_fn.__chandle__() if self.accept_fn is not None else None,
                           ctypes.addressof(mviews), ctypes.addressof(self.tokens), ctypes.addressof(self.ok),
                           ctypes.addressof(c_cuts))
        keep += [mviews, c_cuts]
        self._key, self._keep, self.args, self.n = key, (keep, self.batches), args, k

    def _acc(self, tokens: list[int] | None) -> Any:
        if tokens is None:
            return None
        self.tokens[:] = tokens
        return ctypes.byref(self.acc)

    def __call__(self, inner: list, bitmask: Any, words: Any, seq: int, tokens: list[int] | None = None) -> float:
        """Fill ``bitmask[j]`` from ``inner[j]`` (xgrammar matchers, none terminated) and open ``words[0]`` to ``seq``
        (0: no word): perf_counter seconds when the fill ended, or 0.0 when the native call failed (nothing opened;
        the caller fills again through the Python API and opens the word). ``tokens`` (session 15): row j's matcher
        accepts ``tokens[j]`` first, in the same call (results: :meth:`accepted`)."""
        self._prepare(inner, bitmask)
        word = words.data_ptr() if words is not None else None
        rc = self.lib.octavo_fill_open(ctypes.byref(self.fns), self.args, self.n, self.pool, word, seq,
                                       ctypes.byref(self.t_end), self._acc(tokens))
        return self.t_end.value if rc == 0 else 0.0

    def start(self, inner: list, bitmask: Any, words: Any, seq: int, tokens: list[int] | None = None) -> bool:
        """:meth:`__call__`'s work handed to the pool, not waited for (the GIL kept for the few microseconds of the
        call): True once queued, False where it cannot be (then nothing was done). Until :meth:`join` nothing may
        touch ``inner``'s matchers or ``bitmask``."""
        if not self.started or self.pool is None:
            return False
        self._prepare(inner, bitmask)
        word = words.data_ptr() if words is not None else None
        rc = self.gil.octavo_fill_open_start(ctypes.byref(self.fns), self.args, self.n, self.pool, word, seq,
                                             self._acc(tokens))
        self.pending = rc == 0
        return self.pending

    def join(self) -> float:
        """Wait for the started fill (GIL released only while it still runs): as :meth:`__call__` returns."""
        self.pending = False
        lib = self.gil if self.gil.octavo_fill_done(self.pool) else self.lib
        rc = lib.octavo_fill_join(self.pool, ctypes.byref(self.t_end))
        return self.t_end.value if rc == 0 else 0.0

    def accepted(self, n: int) -> bytes:
        """The last call's accept results of its ``n`` rows: 1 accepted, 0 refused, 2 the call failed."""
        return ctypes.string_at(ctypes.addressof(self.ok), n)


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
