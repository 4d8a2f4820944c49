"""What the xgrammar backend and its worker process share (xgrammar_backend.py, xgrammar_worker.py): the matcher
wrapper, the batched accept and the batched fill of a step's rows."""

from __future__ import annotations

from itertools import repeat
from typing import Any

from octavo.env_flags import env_switch
from octavo.structured_outputs import GrammarMatcher

# read the batch accept's result back without FFI calls that release the GIL (_batch_accept); False: xgrammar's own
ACCEPT_READBACK_KEEPS_GIL = True
# Session 14, opt-in (OCTAVO_GRAMMAR_ACCEPT_KEEPS_GIL=1): the batch accept call itself keeps the GIL (~5 us of C at
# batch 32) instead of releasing it, so its thread does not queue for the GIL again behind another thread when it
# returns (the flag is xgrammar's Function's ``release_gil``, process-wide; set on the next accept). Benchmark modes
# json_async_acceptgil, json_async_nativeopen_p4_poolaccept (with structured_output.ACCEPT_ON_FILL_THREAD).
ACCEPT_KEEPS_GIL = env_switch("OCTAVO_GRAMMAR_ACCEPT_KEEPS_GIL", False)
_READBACK: dict[str, Any] = {}


class _Matcher(GrammarMatcher):
    """An xgrammar matcher whose "terminated" state is kept in Python: an xgrammar matcher (built without
    ``terminate_without_stop_token``) terminates only by accepting one of its stop tokens, so the flag is read
    back from xgrammar only after such a token. Why: the engine asks every row of every step (before the accept
    and in the fill), and 32 calls through two Python layers into C++ were ~14% of the accept's time in a
    host-bound profile (py-spy, session 7), on the critical path of an async structured step."""

    __slots__ = ("m", "_stop", "terminated", "h")

    def __init__(self, matcher: Any) -> None:
        self.m = matcher
        self._stop = frozenset(matcher.stop_token_ids)
        self.terminated = matcher.is_terminated()
        self.h = getattr(matcher, "_handle", None)  # the native handle _batch_accept passes (fixed per matcher)

    def accept_token(self, token_id: int) -> bool:
        ok = self.m.accept_token(token_id)
        if token_id in self._stop:
            self.terminated = self.m.is_terminated()
        return ok

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self.m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self.terminated

    def reset(self) -> None:
        self.m.reset()
        self.terminated = self.m.is_terminated()


def _batch_accept(xgr: Any, matchers: list[Any], tokens: list[int], handles: list[Any] | None = None) -> list[bool]:
    """xgrammar's ``BatchGrammarMatcher.batch_accept_token`` without its per-element read-back of the result.

    Why: xgrammar turns the native result array into a list with two FFI calls per row (``len`` and the item),
    and tvm_ffi releases the GIL on every FFI call, so 32 rows were 64 GIL hand-off points on the engine core's
    thread while the runner's thread launches the next step (session 10 H200 stack samples: 6 % of the core
    thread in tvm_ffi's container code; 38 us per step alone on the 2-vCPU VM). Here the items are read by a
    private handle of the same FFI function that keeps the GIL (``ACCEPT_READBACK_KEEPS_GIL``): ~6 us, no
    release. Same call, same results; any internal name missing falls back to the public API. ``handles``: the
    matchers' native handles (``_Matcher.h``), when the caller has them."""
    getter = _READBACK.get("getter")
    if getter is None and ACCEPT_READBACK_KEEPS_GIL and not _READBACK.get("failed"):
        try:
            import tvm_ffi
            from xgrammar.base import _core

            getter = tvm_ffi.get_global_func("ffi.ArrayGetItem")  # a new handle: its flag is not the library's
            getter.release_gil = False
            _READBACK["core"], _READBACK["getter"] = _core, getter
        except Exception:  # noqa: BLE001 - another xgrammar / tvm_ffi layout: the public call below
            _READBACK["failed"] = True
    if getter is None or not ACCEPT_READBACK_KEEPS_GIL:
        return xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
    if handles is None or None in handles:
        handles = [m._handle for m in matchers]
    fn = _READBACK["core"].BatchGrammarMatcher.batch_accept_token
    if fn.release_gil == ACCEPT_KEEPS_GIL:  # (ACCEPT_KEEPS_GIL changed since the last accept)
        fn.release_gil = not ACCEPT_KEEPS_GIL
    res = fn(handles, tokens, False)
    return list(map(bool, map(getter, repeat(res), range(len(matchers)))))  # (the items in one C loop)


def fill_rows(xgr: Any, batch: Any, matchers: list[GrammarMatcher], bitmask: Any, inner: list | None = None) -> None:
    """``bitmask[j]`` from ``matchers[j]``, live rows in one call of ``batch`` (a ``BatchGrammarMatcher``; also
    the grammar worker's fill, plugins/structured_output/xgrammar_worker.py). ``inner``: the xgrammar matchers of
    ``matchers`` when they are all ``_Matcher`` (the caller's, kept per batch): fewer per-row steps before the
    native call releases the GIL (this runs on the bitmask thread while the core thread wants the GIL)."""
    # a matcher that accepted its stop token (EOS under ignore_eos) constrains nothing more, as in vLLM:
    # its row is all ones (the engine then applies no mask); xgrammar raises if asked for its mask
    done = [m.is_terminated() for m in matchers]
    if inner is not None and len(inner) > 1 and not any(done):  # (the usual step: every row live, all ours)
        batch.batch_fill_next_token_bitmask(inner, bitmask, indices=None)
        return
    live = [j for j, d in enumerate(done) if not d]
    if len(live) < len(matchers):
        bitmask[[j for j, d in enumerate(done) if d]] = -1
    if len(live) > 1 and all(isinstance(matchers[j], _Matcher) for j in live):
        batch.batch_fill_next_token_bitmask([matchers[j].m for j in live], bitmask,
                                            indices=None if len(live) == len(matchers) else live)
    else:
        for j in live:
            matchers[j].fill_bitmask(bitmask, j)
