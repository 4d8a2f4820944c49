"""Kernel table of a captured decode graph on every rank (a ``collective_rpc`` target of benchmarks/gpu_tp.py).

Why: the TP=2 batch-1 step is 3.5 ms of graph against 2.3 ms of weights per GPU; which kernels hold the rest
(GEMV efficiency, the small per-layer kernels, the all-reduces) decides what to fuse next (issue 12). Every rank
replays at once, so the all-reduces inside pair up as in a real step.
"""

from __future__ import annotations


def graph_kernel_table(worker, size: int, iters: int) -> dict:
    """Profile ``iters`` replays of the captured decode graph of ``size`` rows on this rank: its kernel table, the
    kernels' summed time and the replays' wall time per replay (the difference: gaps between kernels)."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.fp8_bs1 import kernel_table  # us per replay by kernel name, launches per replay

    runner = getattr(worker.runner, "graph_runner", None)
    graph = getattr(runner, "graphs", {}).get(size)
    if graph is None:
        return {}
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize(worker.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(iters):
            graph.replay()
        torch.cuda.synchronize(worker.device)
        wall = (time.perf_counter() - t) / iters
    table = kernel_table(prof, iters, limit=30)
    return {"kernels": table, "kernels_us_total": round(sum(r["us"] for r in table), 1),
            "launches": round(sum(r["calls"] for r in table), 1), "wall_us_profiled": round(wall * 1e6, 1)}
