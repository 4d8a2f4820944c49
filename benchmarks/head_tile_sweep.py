"""The LM head's one-row GEMV tile, timed alone on the real head weight (session 16, benchmarks/head16_ab.py
``step_tile``): the head is 0.333 ms of a batch-1 fp8 token (1.05 GB at ~3.15 TB/s) with the autotuner's tile, picked
alone with L2 flushed. Each candidate (the autotuner's 8 plus a few more) runs ``iters`` times back to back (CUDA
events; the weight is 20x the L2, so each call streams it from memory), best of ``rounds``; the tile the GEMV launches
now (``cuda_gemv_table.lookup`` or the autotuner's choice) is timed the same way as ``current``."""

from __future__ import annotations

EXTRA = ((4, 1024, 4, 4), (8, 2048, 8, 2), (16, 2048, 8, 2), (32, 1024, 8, 2))


def _time(fn, iters: int, rounds: int) -> float:
    import torch

    best = float("inf")
    for _ in range(rounds):
        fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / iters)
    return best


def sweep(weight, iters: int = 20, rounds: int = 2) -> dict:
    """ms per call by tile ``"BN,BK,warps,stages"`` (and ``current``), the best tile and its rate in TB/s."""
    import torch
    import triton

    from octavo.plugins.platforms import cuda_gemv

    N, K = weight.shape
    x = torch.randn(1, K, device=weight.device, dtype=weight.dtype)
    y = torch.empty(1, N, device=weight.device, dtype=weight.dtype)
    even = K % 1024 == 0 and N % 64 == 0
    tiles = [(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) for c in cuda_gemv._GEMV_CONFIGS]
    tiles += [t for t in EXTRA if t not in tiles]
    out: dict = {"current": _time(lambda: cuda_gemv.gemv(x, weight), iters, rounds)}
    for bn, bk, w, st in tiles:
        if even and (N % bn or K % bk):
            continue

        def run(bn=bn, bk=bk, w=w, st=st):
            cuda_gemv._gemv_kernel[(triton.cdiv(N, bn),)](x, weight, None, y, N, K, weight.stride(0), HAS_BIAS=False,
                                                          EVEN=even, BLOCK_N=bn, BLOCK_K=bk, num_warps=w,
                                                          num_stages=st, **cuda_gemv.launch_opts())
        try:
            out[f"{bn},{bk},{w},{st}"] = _time(run, iters, rounds)
        except Exception as e:  # noqa: BLE001 - a tile that does not build here is left out
            out[f"{bn},{bk},{w},{st}"] = f"{type(e).__name__}: {e}"[:120]
    timed = {k: v for k, v in out.items() if k != "current" and isinstance(v, float)}
    best = min(timed, key=timed.get)
    nbytes = weight.numel() * weight.element_size()
    return {"ms": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}, "best": best,
            "best_ms": round(timed[best], 4), "best_TBps": round(nbytes / timed[best] / 1e9, 3),
            "current_TBps": round(nbytes / out["current"] / 1e9, 3),
            "best_tile": tuple(int(v) for v in best.split(","))}
