"""Small-message all-reduce on GPUs: NCCL (``torch.distributed``) vs the one-shot symmetric-memory all-reduce
of core/tp_comm.py, checked for correctness, timed eager and inside a CUDA graph; plus the device copy rate.

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

SIZES = [8 << 10, 64 << 10, 512 << 10, 1 << 20]


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


def worker(rank: int, world: int, port: int, calls: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dev = torch.device("cuda", rank)
    res: dict = {"world": world, "calls_per_graph": calls, "sizes": {}}
    if rank == 0:
        res["copy_rate_Bps"] = copy_rate(dev)
    from octavo.core.tp_comm import SymmMemAllReduce

    try:
        symm = SymmMemAllReduce(None, dev, torch.bfloat16)
    except Exception as e:  # noqa: BLE001 - recorded, NCCL is still measured
        symm, res["symm_mem_error"] = None, f"{type(e).__name__}: {e}"

    def nccl(x):
        dist.all_reduce(x)
        return x

    for size in SIZES:
        n = size // 2
        row: dict = {}
        for name, fn in (("nccl", nccl), ("symm_mem", symm)):
            if fn is None:
                continue
            try:
                x = torch.full((n,), float(rank + 1), dtype=torch.bfloat16, device=dev)
                fn(x)
                torch.cuda.synchronize()
                ok = bool((x == world * (world + 1) / 2).all())
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
                g1 = torch.cuda.CUDAGraph()  # correctness of a captured reduction
                with torch.cuda.graph(g1):
                    fn(x)
                x.fill_(float(rank + 1))
                g1.replay()
                torch.cuda.synchronize()
                ok_graph = bool((x == world * (world + 1) / 2).all())
                dist.barrier()
                t = time.perf_counter()
                for _ in range(100):
                    fn(x.fill_(1.0))
                torch.cuda.synchronize()
                eager_us = (time.perf_counter() - t) / 100 * 1e6
                row[name] = {"correct": ok, "correct_in_graph": ok_graph, "graph_us_per_call": graph_us,
                             "eager_us_per_call": eager_us}
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
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args.calls, args.out), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
