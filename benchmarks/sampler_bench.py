"""Sampler microbenchmark: the torch path vs the fused Triton path (``plugins/platforms/cuda_sampler.py``), one GPU.

    python benchmarks/sampler_bench.py --rows 1 64 256 --vocab 151936 --out /tmp/sampler.json

Per case (rows x vocab, logits dtype, temperature 0.6, no top-k/top-p/min-p: the nano-vllm workload) it
times ``Sampler(kernel)(logits, batch)`` as the model runner calls it, eagerly, ``--iters`` calls back to back then
one synchronize: microseconds per call, host launch cost included. fp32 is what ``compute_logits`` hands the
sampler today; bf16 is the fused kernel's reading of a bf16 tensor (the torch path converts it first).
Also top_k=20 + top_p=0.95 (Qwen3's recommended sampling): the torch path sorts each row, the fused path
takes a top-20 and one threshold per row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def bench(sampler, logits, batch, iters: int) -> float:
    import torch

    for _ in range(3):
        sampler(logits, batch)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        sampler(logits, batch)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def main() -> None:
    import torch

    from octavo.core.sampler import Sampler, SamplingBatch
    from octavo.plugins.platforms.cuda import CudaPlatform

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument("--qk-out", default=None, help="then also benchmarks/qk_norm_rope_bench.py, JSON here")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    old, new = Sampler(), Sampler(CudaPlatform().make_fused_sampler())  # what the worker gives the runner
    old.fused = False
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for rows in args.rows:
            logits = (torch.randn(rows, args.vocab, device=dev) * 3).to(dtype)
            t = torch.full((rows,), 0.6, device=dev)
            b = SamplingBatch(temperature=t, top_p=torch.ones(rows, device=dev),
                              top_k=torch.full((rows,), args.vocab, device=dev), min_p=torch.zeros(rows, device=dev),
                              all_greedy=False, no_top_p=True, no_top_k=True, no_min_p=True)
            assert new.uses_fused(logits, b) and not old.uses_fused(logits, b)
            us_old = bench(old, logits, b, args.iters)
            us_new = bench(new, logits, b, args.iters)
            g = SamplingBatch(**{**b.__dict__, "temperature": torch.zeros(rows, device=dev), "all_greedy": True})
            us_greedy = bench(new, logits, g, args.iters)
            # Qwen3's recommended sampling (top_k=20, top_p=0.95): the torch path sorts whole rows
            f = SamplingBatch(**{**b.__dict__, "top_k": torch.full((rows,), 20, device=dev),
                                 "top_p": torch.full((rows,), 0.95, device=dev), "no_top_k": False,
                                 "no_top_p": False, "top_k_bound": 20})
            assert new.uses_fused(logits, f)
            us_old_f = bench(old, logits, f, args.iters)
            us_new_f = bench(new, logits, f, args.iters)
            gb = rows * args.vocab * logits.element_size() / 1e9
            res = {"dtype": str(dtype).split(".")[-1], "rows": rows, "vocab": args.vocab, "torch_us": us_old,
                   "fused_us": us_new, "speedup": us_old / us_new, "greedy_argmax_us": us_greedy,
                   "fused_read_GBps": gb / (us_new * 1e-6), "topk20_topp095_torch_us": us_old_f,
                   "topk20_topp095_fused_us": us_new_f}
            print(json.dumps(res), flush=True)
            results.append(res)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"card": torch.cuda.get_device_name(), "command": "python benchmarks/sampler_bench.py",
                       "results": results}, f, indent=1)
    if args.qk_out:  # same process: no second import of torch/octavo on a time-boxed device run
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from qk_norm_rope_bench import bench as qk_bench

        with open(args.qk_out, "w") as f:
            json.dump(qk_bench([1, 64, 139, 256]), f, indent=1)


if __name__ == "__main__":
    main()
