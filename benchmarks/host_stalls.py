"""Where a batch-1 generation's wall time goes beyond its steady steps (session 16, benchmarks/head16_ab.py
``--stall-diag``): call 1 showed the device step at 3.25-3.32 ms (CUDA trace, stable to +-5 us) while the wall-clock
ms/token of 256-token windows ranged 3.16-3.55, i.e. tens of ms per window that no steady step explains.

Per generation: the interval between consecutive returns of ``LLMEngine.step`` (the engine's own loop), its median,
p99 and max, the intervals above ``factor`` x the median ("stalls": how many and their excess ms over the median), and
Python's cyclic GC during the run (``gc.callbacks``: ms and count by generation). A stall with GC time of the same
size is the collector; one without is something else (the host's scheduler, a host allocation, a neighbour)."""

from __future__ import annotations

import gc
import statistics
import time


def stall_diag(llm, run, runs: int = 4, factor: float = 3.0) -> list[dict]:
    """``run()`` ``runs`` times (one generation each) with the engine's step intervals and GC recorded."""
    engine = llm.llm_engine
    orig = engine.step
    stamps: list[float] = []
    gcs: list[tuple[int, float]] = []
    started: dict = {}

    def step():
        out = orig()
        stamps.append(time.perf_counter())
        return out

    def on_gc(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            gcs.append((info.get("generation", -1), (time.perf_counter() - started.pop("t")) * 1e3))

    out = []
    engine.step = step
    gc.callbacks.append(on_gc)
    try:
        for _ in range(runs):
            stamps.clear()
            gcs.clear()
            t0 = time.perf_counter()
            run()
            wall = time.perf_counter() - t0
            iv = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
            if len(iv) < 3:
                out.append({"error": f"{len(stamps)} steps"})
                continue
            med = statistics.median(iv)
            big = [x for x in iv if x > factor * med]
            by_gen: dict = {}
            for g, ms in gcs:
                n, total = by_gen.get(g, (0, 0.0))
                by_gen[g] = (n + 1, total + ms)
            out.append({"wall_ms": round(wall * 1e3, 2), "steps": len(stamps), "median_ms": round(med, 4),
                        "p99_ms": round(sorted(iv)[int(0.99 * (len(iv) - 1))], 3), "max_ms": round(max(iv), 3),
                        "stalls": len(big), "stall_excess_ms": round(sum(x - med for x in big), 2),
                        "first_ms": round(iv[0], 3), "last_ms": round(iv[-1], 3),
                        "gc_ms_by_generation": {str(g): [n, round(ms, 2)] for g, (n, ms) in sorted(by_gen.items())}})
    finally:
        engine.step = orig
        gc.callbacks.remove(on_gc)
    return out
