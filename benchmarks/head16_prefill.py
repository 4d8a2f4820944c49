"""Where a batch-1 generation's prefill step goes (session 17, engineer head17; benchmarks/head16_ab.py
``--prefill-profile``). Call 1 of the session (H200, the headline's engine) found each generation's first step -- the
512-token prompt's last 16 tokens, the prefix cache holding 496 -- launching for 26-47 ms on the step thread and ending
on the device ~1 ms after its launch: the eager forward's host time, and the e2e key's window noise.

:func:`prefill_profile` runs 1-token generations (one prefill step each) of ``gen_one``:
  * ``runs`` unprofiled: the step's launch time (the worker's ``execute``) and the generation's time;
  * one with the step thread's ``execute`` under cProfile: the top functions by own time and by cumulative time (the
    profiler roughly doubles Python's cost: read the shares, not the ms);
  * on CUDA one under a CUDA-only torch profiler: the device's busy time (the union of its ops), its op count and the
    top kernels, against the step's wall time: host-bound when busy << wall.
"""

from __future__ import annotations

import cProfile
import pstats
import time


def _top(stats: pstats.Stats, key: int, n: int) -> list:
    rows = []
    for (path, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        rows.append((tottime if key == 0 else cumtime, f"{path.rsplit('/', 2)[-1]}:{line} {name}", ncalls, tottime,
                     cumtime))
    rows.sort(reverse=True)
    return [[where, calls, round(tot * 1e3, 3), round(cum * 1e3, 3)] for _, where, calls, tot, cum in rows[:n]]


def prefill_profile(llm, gen_one, cuda: bool, runs: int = 4, top: int = 25) -> dict:
    driver = llm.llm_engine.core.executor.driver
    orig = driver.execute
    launches: list[float] = []
    prof = cProfile.Profile()
    state = {"profile": False, "first": True}

    def execute(*a, **k):
        first = state["first"]
        state["first"] = False
        on = first and state["profile"]
        if on:
            prof.enable()
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            if first:
                launches.append((time.perf_counter() - t) * 1e3)
            if on:
                prof.disable()

    out: dict = {}
    driver.execute = execute
    try:
        walls = []
        for _ in range(runs):
            state["first"] = True
            walls.append(gen_one() * 1e3)
        out["launch_ms"] = [round(x, 2) for x in launches]
        out["generation_ms"] = [round(x, 2) for x in walls]
        state["first"], state["profile"] = True, True
        gen_one()
        out["profiled_launch_ms"] = round(launches[-1], 2)
        stats = pstats.Stats(prof)
        out["cprofile_total_ms"] = round(stats.total_tt * 1e3, 2)
        out["by_own_time"] = _top(stats, 0, top)
        out["by_cumulative"] = _top(stats, 1, top)
        out["calls"] = sum(v[1] for v in stats.stats.values())
    finally:
        driver.execute = orig
    if cuda:
        import torch
        from torch.profiler import ProfilerActivity, profile

        from benchmarks.step_trace import busy_us, device_ops

        with profile(activities=[ProfilerActivity.CUDA]) as p:
            t = time.perf_counter()
            gen_one()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t
        ops = sorted(device_ops(p))  # (start us, end us, name)
        busy = busy_us(ops)
        by: dict = {}
        for s, e, name in ops:
            n, us = by.get(name[:70], (0, 0.0))
            by[name[:70]] = (n + 1, us + e - s)
        out["device"] = {"generation_ms": round(wall * 1e3, 2), "busy_ms": round(busy / 1e3, 3), "ops": len(ops),
                         "span_ms": round((ops[-1][1] - ops[0][0]) / 1e3, 3) if ops else 0.0,
                         "top_ops_us": {k: [n, round(us, 1)] for k, (n, us) in
                                        sorted(by.items(), key=lambda kv: -kv[1][1])[:15]}}
    return out
