"""The cyclic GC while the engine steps: no full collection in the middle of a run, and the heap that exists
when the run starts left out of the GC's scans.

A full (oldest-generation) collection holds the GIL for as long as it walks the heap, so the engine core's thread
and the step thread both stop and the GPU idles once its queued steps are done. Session 9, GPU batch 1 (H200,
the nano-vllm run, 1,038 steps, benchmarks/nano_host_gap.py): 2-3 full collections per 6-6.6 s run took 0.25-0.48
s, 125-170 ms each, and the GPU's idle time between steps was 0.495 s of which 0.479 s overlapped them (steady
decode steps otherwise idle < 0.05 ms). Young collections (gen0/gen1: ~950 a run, ~0.1 ms each) hide behind the
two queued steps. Freezing the start-up heap alone (``gc.freeze``) did not shorten them (0.125 vs 0.14 s each):
the objects a run makes (per-request token lists, outputs) are what they walk.

:func:`frozen_heap` therefore, while its outermost scope lasts:
  * raises the third GC threshold (gen1 collections between two full ones) from Python's 10 to
    :data:`FULL_EVERY` = 1,000: ~80 gen1 collections per nano-vllm run, so no full collection inside one, and
    about one per 12 such runs in a serving loop (cyclic garbage that reached the oldest generation waits that
    long; young cycles are collected as before);
  * moves every object alive at entry to the permanent generation (``gc.freeze()``, O(1)) and back at exit
    (``gc.unfreeze()``), so a full collection that does run walks only what was allocated since (a loaded engine
    process holds 0.3-0.5 M tracked objects; one full pass over them took 0.37-0.44 s on a loaded 2-vCPU AMD EPYC).
Both are undone at exit (thresholds restored, unfrozen), so an unreachable cycle among the frozen objects is
collected afterwards. Used around ``LLM``'s stepping loop (sdk/llm.py) and the engine core's serving loop
(core/engine_core_proc.py). Nested or concurrent scopes share one setting (the GC is per process). A process that
froze objects itself (a freeze count at entry) keeps its freeze (the threshold is still raised).
``OCTAVO_GC_FREEZE=0`` turns both off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: gen1 collections between two full ones inside a scope (Python's default: 10); see the module docstring
FULL_EVERY = 1000

_lock = threading.Lock()
_state = {"depth": 0, "froze": False, "thresholds": None}


def enabled() -> bool:
    from octavo.env_flags import env_switch

    return env_switch("OCTAVO_GC_FREEZE", True)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Until the outermost scope exits: full collections at most every :data:`FULL_EVERY` gen1 collections, and
    the objects alive now invisible to the cyclic GC."""
    if not enabled():
        yield
        return
    with _lock:
        if _state["depth"] == 0:
            t0, t1, t2 = _state["thresholds"] = gc.get_threshold()
            gc.set_threshold(t0, t1, max(t2, FULL_EVERY))
            _state["froze"] = gc.get_freeze_count() == 0  # someone else's freeze: not ours to undo
            if _state["froze"]:
                gc.freeze()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                if _state["froze"]:
                    gc.unfreeze()
                    _state["froze"] = False
                if _state["thresholds"] is not None:
                    gc.set_threshold(*_state["thresholds"])
                    _state["thresholds"] = None


__all__ = ["FULL_EVERY", "enabled", "frozen_heap"]
