"""Batch-1 GEMV tiles per weight shape, timed inside a PDL chain on a rank's real layer weights, and a switch that
makes the live engine use chosen tiles (``collective_rpc`` targets of benchmarks/gpu_tp.py; issue 12).

Why: the autotuner (cuda_fusions.gemv) times each tile alone with L2 flushed and no programmatic dependent launch;
in the decode graph a GEMV starts under PDL while its predecessor runs and loads its first tile early. Here each
candidate tile runs as ``RMSNorm -> GEMV(layer i)`` for every layer's weight of that shape, captured in one CUDA
graph with PDL as the step launches it, so a tile's time includes what PDL hides or not; the winners then go into
the engine (plugins/platforms/cuda_gemv_table.py ``set_override``) and the real graph is re-captured and timed.
"""

from __future__ import annotations

import json
import time

# (BLOCK_N, BLOCK_K, num_warps, num_stages): four of the autotuner's 8 tiles (those it picks for these shapes) and
# new ones (smaller BLOCK_N: more programs; BLOCK_K 2048: a K=2048 weight's whole row span in the PDL-prefetched
# first tile); a shape's autotuner pick outside this list is timed too
CANDIDATES = [(8, 512, 4, 3), (16, 512, 4, 3), (16, 1024, 8, 3), (8, 1024, 4, 4), (4, 1024, 4, 3), (4, 512, 2, 4),
              (8, 2048, 8, 2), (4, 2048, 4, 2), (16, 2048, 8, 2), (8, 512, 2, 4), (4, 256, 2, 4), (2, 1024, 2, 3)]


def _layer_weights(model):
    """``{(N, K): [weights]}`` of the layers on cuda_fusions' GEMV method (the plain batch-1 GEMV), bias-free."""
    out: dict = {}
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if name.endswith("gate_up_proj"):  # batch 1 runs it in the gate/up + SiLU GEMV (its own tiles)
            continue
        if type(getattr(m, "quant_method", None)).__name__ == "TritonGemvLinearMethod" and getattr(m, "bias", None) \
                is None and w is not None and w.dim() == 2:
            out.setdefault(tuple(w.shape), []).append(w)
    return out


def _launcher(x, ws, y, even: bool, tile):
    """``launch(i)``: cuda_fusions' batch-1 GEMV kernel on layer ``i``'s weight with ``tile``, PDL as the engine's."""
    import triton

    from octavo.plugins.platforms import cuda_fusions
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    bn, bk, nw, ns = tile

    def launch(i):
        N, K = ws[i].shape
        cuda_fusions._gemv_kernel[(triton.cdiv(N, bn),)](x, ws[i], None, y, N, K, ws[i].stride(0), HAS_BIAS=False,
                                                         EVEN=even, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw,
                                                         num_stages=ns, **launch_opts())
    return launch


def gemv_sweep(worker, out_path: str, iters: int = 15, shapes: list | None = None) -> dict:
    """For each GEMV weight shape of this rank's model (or ``shapes``), us per GEMV of every candidate tile in a PDL
    chain ``RMSNorm -> GEMV`` over all layers' weights (norm-only chain subtracted) and the autotuner's pick. Each
    rank on its own (no collectives); the rank's results go to ``out_path`` (.rankN.json) after every shape."""
    import torch

    from octavo.plugins.platforms import cuda_fusions
    from octavo.plugins.platforms.cuda_allreduce_gemv import plain_gemv_config
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    model, dev = worker.runner.model, worker.device
    weights = _layer_weights(model)
    rank = getattr(worker, "rank", 0)
    res: dict = {"device": torch.cuda.get_device_name(dev), "pdl": launch_opts().get("PDL", False), "shapes": {}}
    norm_w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    h = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)

    def chain_ms(launch, n) -> float:
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for i in range(n):
                cuda_fusions.rms_norm(h, norm_w, 1e-5)
                launch(i)
        torch.cuda.current_stream(dev).wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(n):
                cuda_fusions.rms_norm(h, norm_w, 1e-5)
                launch(i)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize(dev)
        best = float("inf")
        for _ in range(2):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                g.replay()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / iters)
        return best

    with torch.inference_mode():
        for (N, K), ws in sorted(weights.items()):
            if shapes is not None and [N, K] not in [list(s) for s in shapes]:
                continue
            x = torch.randn(1, K, device=dev, dtype=ws[0].dtype)
            y = torch.empty(1, N, device=dev, dtype=ws[0].dtype)
            even = K % 1024 == 0 and N % 64 == 0
            t0 = time.perf_counter()
            norm_only = chain_ms(lambda i: None, len(ws))
            auto = plain_gemv_config(N, K, ws[0].dtype, dev)
            row = {"layers": len(ws), "MB": N * K * 2 / 1e6, "auto": auto, "norm_chain_ms": norm_only, "us": {}}
            auto_tile = (auto["BLOCK_N"], auto["BLOCK_K"], auto["num_warps"], auto["num_stages"]) if auto else None
            for bn, bk, nw, ns in CANDIDATES + ([auto_tile] if auto_tile and auto_tile not in CANDIDATES else []):
                if even and (K % bk or N % bn):
                    continue
                try:
                    us = (chain_ms(_launcher(x, ws, y, even, (bn, bk, nw, ns)), len(ws)) - norm_only) / len(ws) * 1e3
                except Exception as e:  # noqa: BLE001 - a tile that does not compile / fit: recorded, skipped
                    row["us"][f"{bn},{bk},{nw},{ns}"] = f"{type(e).__name__}: {str(e)[:120]}"
                    continue
                row["us"][f"{bn},{bk},{nw},{ns}"] = round(us, 3)
            timed = {k: v for k, v in row["us"].items() if isinstance(v, float)}
            if timed:
                best = min(timed, key=timed.get)
                row.update({"best": best, "best_us": timed[best], "best_TBps": N * K * 2 / timed[best] / 1e6})
                if auto:
                    ak = f"{auto['BLOCK_N']},{auto['BLOCK_K']},{auto['num_warps']},{auto['num_stages']}"
                    row.update({"auto_key": ak, "auto_us": timed.get(ak)})
            row["sweep_s"] = round(time.perf_counter() - t0, 1)
            res["shapes"][f"{N}x{K}"] = row
            with open(f"{out_path}.rank{rank}.json", "w") as f:
                json.dump(res, f, indent=1)
    return res


def set_gemv_tiles(worker, entries: dict) -> str:
    """Use ``{"NxK": [BLOCK_N, BLOCK_K, warps, stages]}`` for those GEMV shapes on this rank (every rank at once: the
    pushing GEMV must match on both) and re-capture the decode graphs; ``{}`` = back to the table/autotuner."""
    from octavo.plugins.platforms.cuda_gemv_table import set_override

    tiles = {tuple(int(v) for v in k.split("x")): tuple(t) for k, t in entries.items()}
    set_override(tiles)
    runner = getattr(worker.runner, "graph_runner", None)
    if runner is not None:
        runner.capture()
    return f"tiles {sorted(tiles.items())}"


def pick_tiles(sweeps: list[dict], margin: float = 0.02) -> dict:
    """``{"NxK": tile}`` per shape: the candidate with the lowest mean time over ranks, kept only when it beats the
    autotuner's pick by more than ``margin`` (relative) in that mean."""
    tiles = {}
    for shape, row in (sweeps[0].get("shapes") or {}).items():
        rows = [s["shapes"].get(shape, {}) for s in sweeps]
        keys = [k for k, v in row["us"].items() if all(isinstance(r.get("us", {}).get(k), float) for r in rows)]
        if not keys:
            continue
        mean = {k: sum(r["us"][k] for r in rows) / len(rows) for k in keys}
        best, auto = min(mean, key=mean.get), row.get("auto_key")
        if auto not in mean or mean[best] < mean[auto] * (1 - margin):
            tiles[shape] = [int(v) for v in best.split(",")]
    return tiles


def sweep_and_ab(llm, res: dict, out_dir: str, rounds: int, bs1, save) -> None:
    """Sweep every rank, pick per-shape tiles, then A/B them against the autotuner's in this engine, alternating
    ``rounds`` times: graphs re-captured, graph replay ms per rank and batch-1 ms/token (``bs1()`` -> (ms, tokens))."""
    import os

    t0 = time.perf_counter()
    sweeps = llm.collective_rpc("benchmarks.gpu_tp_gemv:gemv_sweep", args=[os.path.join(out_dir, "gemv_sweep")])
    res.update({"gemv_sweep_by_rank": sweeps, "gemv_sweep_s": time.perf_counter() - t0})
    tiles = res["gemv_tiles"] = pick_tiles(sweeps)
    save()
    res["gemv_ab"] = []
    for _ in range(rounds if tiles else 0):
        for label, entries in (("tiles", tiles), ("auto", {})):
            state = llm.collective_rpc("benchmarks.gpu_tp_gemv:set_gemv_tiles", args=[entries])
            graph = llm.collective_rpc("benchmarks.gpu_tp:graph_replay_ms", args=[1, 200])
            ms, tokens = bs1()
            res["gemv_ab"].append({"label": label, "state": state[0], "graph_replay_bs1_ms_by_rank": graph,
                                   "decode_bs1_ms_per_token": ms, "bs1_tokens": tokens})
            save()


def set_gemv_table(worker, on: bool) -> str:
    """Use cuda_gemv_table.TABLE (True) or the autotuner for every shape (False) on this rank, and re-capture the
    decode graphs (every rank at once: the pushing GEMV must match on both)."""
    from octavo.plugins.platforms.cuda_gemv_table import TABLE, set_table

    set_table(on)
    runner = getattr(worker.runner, "graph_runner", None)
    if runner is not None:
        runner.capture()
    return f"table {'on' if on else 'off'} ({len(TABLE)} entries)"


def table_ab(llm, res: dict, rounds: int, bs1, save) -> None:
    """The committed table vs the autotuner's tiles in this engine, alternating ``rounds`` times (graphs re-captured,
    graph replay ms per rank, batch-1 ms/token and tokens); the engine is left with the table on."""
    res["table_ab"] = []
    for _ in range(rounds):
        for on in (False, True):
            state = llm.collective_rpc("benchmarks.gpu_tp_gemv:set_gemv_table", args=[on])
            graph = llm.collective_rpc("benchmarks.gpu_tp:graph_replay_ms", args=[1, 200])
            ms, tokens = bs1()
            res["table_ab"].append({"label": "table" if on else "auto", "state": state[0],
                                    "graph_replay_bs1_ms_by_rank": graph, "decode_bs1_ms_per_token": ms,
                                    "bs1_tokens": tokens})
            save()
