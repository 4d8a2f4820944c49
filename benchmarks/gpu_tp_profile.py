"""Kernel table of a captured decode graph on every rank (a ``collective_rpc`` target of benchmarks/gpu_tp.py), and
each rank's copy rate (the roofline's denominator, measured in the engine).

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


def graph_layer_trace(worker, size: int, iters: int = 3) -> dict:
    """The decode graph's kernels in launch order, folded per layer (a ``collective_rpc`` target): for each position
    of a layer's kernel sequence (anchored at the attention kernel) its mean duration and the mean gap since the
    previous kernel ended, over all full layers of ``iters`` profiled replays. Why: the by-name table merges the
    GEMVs of four shapes and, with PDL, counts a kernel's early-launched wait as its time; the per-position trace
    (best taken with PDL off) gives each GEMV shape's own time and where the gaps are (issue 12)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    runner = getattr(worker.runner, "graph_runner", None)
    graph = getattr(runner, "graphs", {}).get(size)
    if graph is None:
        return {}
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize(worker.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            graph.replay()
        torch.cuda.synchronize(worker.device)
    try:
        kernels = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.end > e.time_range.start]
        return fold_layers(kernels)
    except Exception as e:  # noqa: BLE001 - a benchmark diagnostic: report, do not end the run
        return {"error": f"{type(e).__name__}: {e}"}


def fold_layers(kernels: list[tuple[float, float, str]]) -> dict:
    """``(start_us, end_us, name)`` kernels of several replays -> the mean layer (see graph_layer_trace)."""
    kernels = sorted(kernels, key=lambda k: k[0])
    anchors = [i for i, k in enumerate(kernels) if "attention" in k[2].lower()]
    if len(anchors) < 3:
        return {"kernels_seen": len(kernels), "note": "no attention anchors"}
    spans = [b - a for a, b in zip(anchors, anchors[1:])]
    period = max(set(spans), key=spans.count)
    layers = [a for a, b in zip(anchors, anchors[1:]) if b - a == period and a > 0]
    rows = []
    for j in range(period):
        durs = [kernels[a + j][1] - kernels[a + j][0] for a in layers]
        gaps = [kernels[a + j][0] - kernels[a + j - 1][1] for a in layers]
        rows.append({"name": kernels[layers[0] + j][2][:60], "us": round(sum(durs) / len(durs), 2),
                     "gap_us": round(sum(gaps) / len(gaps), 2)})
    walls = [kernels[a + period][0] - kernels[a][0] for a in layers]  # anchor to next anchor: one layer's wall
    return {"layers_folded": len(layers), "kernels_per_layer": period, "layer": rows,
            "layer_wall_us": round(sum(walls) / len(walls), 2),
            "layer_kernels_us": round(sum(r["us"] for r in rows), 2)}


_TRACE: dict = {}


def decode_trace_start(worker) -> bool:
    """Start a CUDA kernel trace on this rank (a ``collective_rpc`` target); :func:`decode_trace_stop` folds what
    ran meanwhile (real decode steps: attention at the real context, unlike the replayed graph's null block)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        prof = profile(activities=[ProfilerActivity.CUDA])
        prof.start()
    except Exception:  # noqa: BLE001 - a diagnostic only
        return False
    _TRACE["prof"] = prof
    return True


def decode_trace_stop(worker, steps: int = 0) -> dict:
    """Stop :func:`decode_trace_start`'s trace; the mean layer of the decode steps it saw (fold_layers) and, per
    step (``steps``: the tokens generated meanwhile), the device span, its idle part and the kernels by name (what
    runs outside the layers: sampling, copies, the LM head, collectives)."""
    import torch

    prof = _TRACE.pop("prof", None)
    if prof is None:
        return {"error": "no trace running"}
    try:
        torch.cuda.synchronize(worker.device)
        prof.stop()
        kernels = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.end > e.time_range.start]
        out = fold_layers(kernels)
        if steps > 0 and kernels:
            out["per_step"] = step_summary(kernels, steps)
        return out
    except Exception as e:  # noqa: BLE001 - a diagnostic: report, do not end the run
        return {"error": f"{type(e).__name__}: {e}"}


def step_summary(kernels: list[tuple[float, float, str]], steps: int) -> dict:
    """Device span / busy / idle per step and the kernels' time per step by name (top 24)."""
    kernels = sorted(kernels, key=lambda k: k[0])
    busy, end = 0.0, kernels[0][0]
    for s, e, _ in kernels:  # union of the kernels' intervals (PDL overlaps them)
        if e > end:
            busy += e - max(s, end)
            end = e
    by_name: dict[str, list] = {}
    for s, e, name in kernels:
        row = by_name.setdefault(name[:70], [0.0, 0])
        row[0] += e - s
        row[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:24]
    span = kernels[-1][1] - kernels[0][0]
    return {"steps": steps, "span_us": round(span / steps, 1), "busy_us": round(busy / steps, 1),
            "idle_us": round((span - busy) / steps, 1),
            "by_name": [f"{t / steps:8.1f} us x{n / steps:6.1f} {name}" for name, (t, n) in top]}


def copy_rate_Bps(worker, nbytes: int) -> float:
    """This rank's device-to-device copy rate, bytes read + written per second (a ``collective_rpc`` target):
    ``nbytes`` copied 20 times, timed with events after 3 untimed copies. NaN where the memory the KV cache left
    cannot hold the two buffers (or on CPU)."""
    import torch

    if worker.device.type != "cuda":
        return float("nan")
    try:
        src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=worker.device)
        dst = torch.empty_like(src)
    except torch.cuda.OutOfMemoryError:
        return float("nan")
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    end.record()
    end.synchronize()
    rate = 2 * nbytes * 20 / (start.elapsed_time(end) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return rate
