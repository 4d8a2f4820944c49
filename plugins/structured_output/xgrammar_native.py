"""xgrammar's batch fill called from C, which then opens the device gate itself: no GIL between the fill's end and
the device's go (session 14, opt-in: ``OCTAVO_GRAMMAR_NATIVE_OPEN=1``, core/grammar_step.py ``NATIVE_OPEN``).

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
#include <stdint.h>
#include <time.h>

typedef struct { int32_t type_index; uint32_t zero_padding; union { int64_t v_int64; void *v_ptr; double v_f; } v; }
    ffi_any;
typedef int (*ffi_call_t)(void *func, ffi_any *args, int32_t num_args, ffi_any *result);
typedef void (*ffi_move_error_t)(void **result);
typedef int (*ffi_decref_t)(void *obj);

/* args: the 5 views Python prepared (self, matchers Array, DLTensor* rows, None, false). Returns the call's rc; on 0,
   word[0] = max(word[0], seq) after the rows are written (seq 0: no word). *t_end: CLOCK_MONOTONIC seconds (Python's
   perf_counter clock on Linux) when the fill returned. */
int octavo_fill_open(ffi_call_t call, ffi_move_error_t move_error, ffi_decref_t decref, void *func, ffi_any *args,
                     int32_t *word, int32_t seq, double *t_end) {
    ffi_any result;
    result.type_index = 0;
    result.zero_padding = 0;
    result.v.v_int64 = 0;
    int rc = call(func, args, 5, &result);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *t_end = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    if (rc == 0) {
        if (result.type_index >= 64 && result.v.v_ptr) decref(result.v.v_ptr);  /* (the method returns None) */
        if (seq > 0 && __atomic_load_n(word, __ATOMIC_ACQUIRE) < seq) __atomic_store_n(word, seq, __ATOMIC_RELEASE);
    } else {
        void *err = 0;
        move_error(&err);
        if (err) decref(err);
    }
    return rc;
}
"""

_state: dict[str, Any] = {}
_P = ctypes.c_void_p


class _Any(ctypes.Structure):
    _fields_ = [("type_index", ctypes.c_int32), ("zero_padding", ctypes.c_uint32), ("v", ctypes.c_int64)]


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

        sig = {"octavo_fill_open": ([_P, _P, _P, _P, _P, _P, ctypes.c_int32, ctypes.POINTER(ctypes.c_double)],
                                    ctypes.c_int)}
        lib = cached_library(_state, C_SOURCE, "octavo_xgrammar_fill_open", ["-O2", "-shared", "-fPIC"], sig)
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
        batch: that thread's ``xgrammar.BatchGrammarMatcher``.
    """

    def __init__(self, batch: Any) -> None:
        from tvm_ffi import core

        self.lib, self.entry = library()
        info = core._type_cls_to_type_info(type(batch._handle))  # noqa: SLF001 - the reflected method's Function
        fn = next(m.func for m in info.methods if m.name == "batch_fill_next_token_bitmask")
        self.batch, self.fn = batch, fn
        self.fn_handle = fn.__chandle__()
        self._key: tuple = ()
        self._keep: tuple = ()  # the Array and the DLTensor's parts, alive while the args point at them
        self.args = (_Any * 5)()
        self.t_end = ctypes.c_double(0.0)

    def _prepare(self, inner: list, bitmask: Any) -> None:
        import tvm_ffi

        n, words = bitmask.shape
        key = (inner, bitmask.data_ptr(), n, words)
        if self._key and self._key[0] is inner and self._key[1:] == key[1:]:
            return
        arr = tvm_ffi.convert([m._handle for m in inner])  # noqa: SLF001
        shape = (ctypes.c_int64 * 2)(n, words)
        strides = (ctypes.c_int64 * 2)(bitmask.stride(0), 1)
        dl = _DLTensor(data=bitmask.data_ptr(), device_type=1, device_id=0, ndim=2, code=0, bits=32, lanes=1,
                       shape=shape, strides=strides, byte_offset=0)  # kDLCPU (pinned memory is host memory), int32
        a = self.args
        a[0].type_index, a[0].v = _object_view(self.batch._handle.__chandle__())  # noqa: SLF001
        a[1].type_index, a[1].v = _object_view(arr.__chandle__())
        a[2].type_index, a[2].v = _DLTENSOR_PTR, ctypes.addressof(dl)
        a[3].type_index, a[3].v = _NONE, 0
        a[4].type_index, a[4].v = _BOOL, 0
        self._key, self._keep = key, (arr, shape, strides, dl, self.batch)

    def __call__(self, inner: list, bitmask: Any, words: Any, seq: int) -> float:
        """Fill ``bitmask[j]`` from ``inner[j]`` (xgrammar matchers, none terminated) and open ``words[0]`` to ``seq``
        (0: no word): perf_counter seconds when the fill ended, or 0.0 when the native call failed (nothing opened;
        the caller fills again through the Python API and opens the word)."""
        self._prepare(inner, bitmask)
        call, move_error, decref = self.entry
        word = words.data_ptr() if words is not None else None
        rc = self.lib.octavo_fill_open(call, move_error, decref, self.fn_handle, self.args, word, seq,
                                       ctypes.byref(self.t_end))
        return self.t_end.value if rc == 0 else 0.0


def clock_matches() -> bool:
    """Whether the shim's CLOCK_MONOTONIC stamps are ``time.perf_counter`` values (Linux CPython: yes)."""
    return time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"
