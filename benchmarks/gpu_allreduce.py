"""Small-message all-reduce on GPUs: NCCL (``torch.distributed``) vs the one-shot symmetric-memory all-reduce
of core/tp_comm.py (``symm_mem``) and the Triton one-shot kernel of plugins/platforms/cuda_allreduce.py
(``custom``): checked against NCCL on random tensors (eager and in CUDA graphs), timed eager and inside a
CUDA graph; plus the device copy rate.

    python benchmarks/gpu_allreduce.py --world 2 --out /tmp/ar.json

Why: TP=2 batch-1 decode on the 8B shape does 64 all-reduces of 8 KiB per token; their latency decides
whether TP=2 reaches 0.6x of TP=1. One graph replay runs ``--calls`` all-reduces back to back (as a decode
step does), so per-call numbers include no launch overhead. Rank 0 also measures the copy rate of one GPU
(bytes read + written per second by a 2 GiB device-to-device copy): the roofline denominator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SIZES = [8 << 10, 16 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20]
LARGE = [2 << 20, 4 << 20, 8 << 20]  # --large: a 512-row decode step's 4 MiB messages (TP=2 throughput run), NCCL
# vs the one-shot kernel built with an 8 MiB buffer (OCTAVO_TP_ALLREDUCE_MAX_BYTES is 1 MiB by default)


def copy_rate(device) -> float:
    import torch

    src = torch.empty(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 2 * 10 / (time.perf_counter() - t)


def _check(fn, rank: int, world: int, n: int, dev, seed: int) -> dict:
    """``fn`` against NCCL on random bf16 tensors of ``n`` elements: eager, then one call captured in a CUDA graph
    and replayed on fresh random inputs (bitwise equality and the largest difference)."""
    import torch
    import torch.distributed as dist

    gen = torch.Generator(device=dev).manual_seed(seed * 16 + rank)
    worst, equal = 0.0, True

    def compare(y, ref):
        nonlocal worst, equal
        equal = equal and torch.equal(y, ref)
        worst = max(worst, (y.float() - ref.float()).abs().max().item())

    x = torch.randn(n, generator=gen, device=dev).to(torch.bfloat16)
    ref = x.clone()
    dist.all_reduce(ref)
    compare(fn(x), ref)
    xs = torch.zeros(n, dtype=torch.bfloat16, device=dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(xs)
    for _ in range(3):
        xs.copy_(torch.randn(n, generator=gen, device=dev))
        ref = xs.clone()
        dist.all_reduce(ref)
        g.replay()
        compare(xs, ref)
    torch.cuda.synchronize()
    return {"bitwise_equal_to_nccl": equal, "max_abs_diff_vs_nccl": worst}


def _time(fn, x, calls: int) -> dict:
    """us per call: ``calls`` back-to-back calls in one CUDA graph (as a decode step does), and eager."""
    import torch
    import torch.distributed as dist

    x.zero_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream before capture
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn(x)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    graph_us = (time.perf_counter() - t) / (20 * calls) * 1e6
    dist.barrier()
    t = time.perf_counter()
    for _ in range(100):
        fn(x)
    torch.cuda.synchronize()
    return {"graph_us_per_call": graph_us, "eager_us_per_call": (time.perf_counter() - t) / 100 * 1e6}


def worker(rank: int, world: int, port: int, calls: int, out: str, which: list, sizes: list) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dev = torch.device("cuda", rank)
    res: dict = {"world": world, "calls_per_graph": calls, "device": torch.cuda.get_device_name(dev), "sizes": {}}
    if rank == 0:
        res["copy_rate_Bps"] = copy_rate(dev)

    def nccl(x):
        dist.all_reduce(x)
        return x

    fns = {"nccl": nccl}
    for name in which:
        try:
            if name == "symm_mem":
                from octavo.core.tp_comm import SymmMemAllReduce

                fns[name] = SymmMemAllReduce(None, dev, torch.bfloat16)
            elif name == "custom":
                from octavo.plugins.platforms.cuda_allreduce import OneShotAllReduce

                fns[name] = OneShotAllReduce(None, dev, max(sizes))
        except Exception as e:  # noqa: BLE001 - recorded, NCCL is still measured
            res[f"{name}_error"] = f"{type(e).__name__}: {e}"
    for name, fn in fns.items():  # correctness first: a mixed sequence of sizes, eager and in graphs
        if name == "nccl":
            continue
        try:
            checks = {str(n * 2): _check(fn, rank, world, n, dev, seed=i)
                      for i, n in enumerate([4096, 1, 777, 65536, 4096 * 3 + 5, max(SIZES) // 2, 4096] +
                                            ([max(sizes) // 2] if name == "custom" and max(sizes) > max(SIZES) else []))}
            res[f"{name}_checks"] = checks
            res[f"{name}_all_bitwise_equal"] = all(c["bitwise_equal_to_nccl"] for c in checks.values())
        except Exception as e:  # noqa: BLE001
            res[f"{name}_checks_error"] = f"{type(e).__name__}: {e}"
        if rank == 0:
            print(name, "checks:", res.get(f"{name}_all_bitwise_equal"), res.get(f"{name}_checks_error", ""),
                  flush=True)
    for size in sizes:
        row: dict = {}
        for name, fn in fns.items():
            if size > max(SIZES) and name == "symm_mem":  # its buffer is OCTAVO_TP_ALLREDUCE_MAX_BYTES: would do nothing
                continue
            try:
                row[name] = _time(fn, torch.zeros(size // 2, dtype=torch.bfloat16, device=dev), calls)
            except Exception as e:  # noqa: BLE001 - recorded per size
                row[name] = {"error": f"{type(e).__name__}: {e}"}
        res["sizes"][str(size)] = row
        if rank == 0:
            print(size, json.dumps(row), flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import socket

    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--out", default="allreduce.json")
    ap.add_argument("--which", nargs="*", default=["symm_mem", "custom"], help="besides NCCL")
    ap.add_argument("--large", action="store_true", help="also 2, 4 and 8 MiB (NCCL and custom only)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sizes = SIZES + (LARGE if args.large else [])
    mp.spawn(worker, args=(args.world, port, args.calls, args.out, args.which, sizes), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
