"""The LoRA graph ops alone (octavo.lora.static), replayed in CUDA graphs: what they add to one decode step.

For a Llama-3-8B shape (32 layers of q/k/v fused, o, gate/up fused, down; every layer its own slot weights, so
the HBM traffic is a real step's), one CUDA graph per (op, slots, batch) runs every projection's LoRA delta
once; its replay time is the LoRA cost added to a graph-replayed decode step. Ops: ``dense`` (all slots' A and
B in two matmuls + a mask), ``fused`` (dense, mask + expand in one Triton kernel) and ``triton`` (fixed-grid SGMV); mixes: tokens spread over every slot, or one slot.

    python benchmarks/lora_graph_ops.py --slots 8 32 --batches 1 16 64 256 --out DIR [--budget-s 20]

Without CUDA it runs each op once eagerly at tiny widths (a dry run of the code path, no timing).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from octavo.lora.static import StaticLoRA

T0 = time.perf_counter()
# (in, [output parts]) per projection of one Llama-3-8B layer
LAYER_8B = [(4096, [4096, 1024, 1024]), (4096, [4096]), (4096, [14336, 14336]), (14336, [4096])]
LAYER_TINY = [(64, [64, 16, 16]), (64, [64]), (64, [128, 128]), (128, [64])]


def log(msg: str) -> None:
    print(f"[lora_graph_ops {time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def build(layers: int, shapes, slots: int, rank: int, dtype, dev):
    """Per layer and projection: A [S, parts*r, in], b_flat [out, S*parts*r] and its [S, out, R] view."""
    out = []
    for _ in range(layers):
        for k, parts in shapes:
            r = rank * len(parts)
            a = torch.randn(slots, r, k, device=dev, dtype=dtype) * 0.01
            b_flat = torch.randn(sum(parts), slots * r, device=dev, dtype=dtype) * 0.01
            out.append((k, a, b_flat.view(sum(parts), slots, r).permute(1, 0, 2), b_flat))
    return out


def step(static: StaticLoRA, weights, xs: dict, ys: list) -> None:
    """Every projection's LoRA delta of one decode step."""
    for (k, a, b, f), y in zip(weights, ys):
        static.apply(xs[k], y, a, b, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes, layers = (LAYER_8B, args.layers) if cuda else (LAYER_TINY, 2)
    ops = ["dense", "fused", "triton"] if cuda else ["dense"]
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "layers": layers, "rank": args.rank,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ms": {}}
    for slots in args.slots:
        weights = build(layers, shapes, slots, args.rank, dtype, dev)
        log(f"slots {slots}: weights {sum(a.numel() + f.numel() for _, a, _, f in weights) * 2 / 2**30:.2f} GiB")
        for op in ops:
            cap = max(args.batches)
            static = StaticLoRA(slots, cap, dtype, dev, use_triton=op == "triton", fused_expand=op == "fused")
            for n in args.batches:
                if time.perf_counter() - T0 > args.budget_s:
                    log("budget spent: stopping")
                    break
                xs = {k: torch.randn(n, k, device=dev, dtype=dtype) for k, _ in shapes}
                ys = [torch.zeros(n, f.shape[0], device=dev, dtype=dtype) for _, _, _, f in weights]

                for mix in ("all_slots", "one_slot"):
                    ts = torch.arange(n) % slots if mix == "all_slots" else torch.zeros(n, dtype=torch.long)
                    static.write(ts, n)
                    step(static, weights, xs, ys)  # warm-up: compiles, picks kernels
                    if not cuda:
                        res["ms"][f"{op}/S{slots}/n{n}/{mix}"] = None
                        continue
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step(static, weights, xs, ys)
                    graph.replay()
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    for _ in range(args.iters):
                        graph.replay()
                    torch.cuda.synchronize()
                    ms = (time.perf_counter() - t) / args.iters * 1e3
                    res["ms"][f"{op}/S{slots}/n{n}/{mix}"] = round(ms, 4)
                    log(f"{op} S={slots} n={n} {mix}: {ms:.3f} ms per step ({layers} layers)")
                    del graph
        del weights
        if cuda:
            torch.cuda.empty_cache()
    print(json.dumps(res), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "lora_graph_ops.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
