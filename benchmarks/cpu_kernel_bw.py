"""Is the CPU int4/int8 kernel bound by memory or by its own code? Its GB/s beside the machine's, in one run.

Why: a batch-1 decode step reads every weight once, so its floor is (weight bytes) / (memory bandwidth).
This measures, per thread count, (a) the machine's read bandwidth (``torch.sum`` over a buffer larger than
the last-level cache, and over one the size of the model's weights) and (b) octavo's int4 / int8 kernels
(plugins/quant/cpu_kernel.py, fp32 activations; plugins/quant/cpu_int8act.py, int8 activations: ``q4a8_*``)
over all of SmolLM2-135M's layer shapes with distinct random weights (30 layers, so nothing stays in L1/L2), at M = 1, reporting bytes read / time. The per-call cost is measured
on a tiny layer (8 x 64), where bytes are nothing. ``--rows`` also times the int8-activation kernel at several row
counts against the path those rows took before it was batch-invariant (session 5): the fp32 kernel up to 16 rows,
a kept fp32 dense copy + torch GEMM past 16 (one SmolLM2 layer of each shape, bf16 input, best of ``--reps``).

    python benchmarks/cpu_kernel_bw.py --threads 1 2 --rows 1 4 16 64 256
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from octavo.plugins.quant import cpu_int8act as a8  # noqa: E402
from octavo.plugins.quant import cpu_int8act_ops  # noqa: E402,F401  (registers octavo_cpu::int4_a8)
from octavo.plugins.quant import cpu_kernel as ck  # noqa: E402

# SmolLM2-135M: hidden 576, intermediate 1536, 9 heads / 3 kv heads of 64, 30 layers, vocab 49152
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down  (N, K)
HEAD = (49152, 576)


def _best(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), sorted(ts)[len(ts) // 2]


def _q4(n: int, k: int):
    w4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    return w4, torch.rand(n, k // 32) * 0.01, torch.rand(n, k // 32) * 0.01


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rows", type=int, nargs="*", default=[], help="row counts for the many-row comparison")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    layers = [[_q4(n, k) for n, k in LAYER_SHAPES] for _ in range(args.layers)]
    q4_bytes = sum(w.numel() + s.numel() * 4 + z.numel() * 4 for lay in layers for w, s, z in lay)
    head_q = torch.randint(-127, 128, HEAD, dtype=torch.int8)
    head_s = torch.rand(HEAD[0], HEAD[1] // 32)
    head_bytes = head_q.numel() + head_s.numel() * 4
    big = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB
    model_sized = torch.ones((q4_bytes + head_bytes) // 4, dtype=torch.float32)
    xs = {k: torch.randn(1, k) for k in (576, 1536)}
    tiny = _q4(8, 64)
    x_tiny = torch.randn(1, 64)
    ck.library()
    res = {"int8act_path": a8.kernel_path(), "isa": sorted(set(open("/proc/cpuinfo").read().split()) & {"avx2", "avx512f", "avx512_vnni", "amx_int8"}),
           "q4_layer_bytes": q4_bytes, "head_bytes": head_bytes, "by_threads": {}}
    for t in args.threads:
        torch.set_num_threads(t)
        r = {}
        best, med = _best(lambda: big.sum(), 5)
        r["mem_read_GBps_1GiB"] = big.numel() * 4 / best / 1e9
        best, med = _best(lambda: model_sized.sum(), args.reps)
        r["mem_read_GBps_model_sized"] = model_sized.numel() * 4 / best / 1e9

        def all_layers():
            for lay in layers:
                for (w, s, z), (_, k) in zip(lay, LAYER_SHAPES):
                    ck._int4_linear(xs[k], w, s, z)
        best, med = _best(all_layers, args.reps)
        r["q4_all_layers_ms"] = best * 1e3
        r["q4_all_layers_median_ms"] = med * 1e3
        r["q4_GBps"] = q4_bytes / best / 1e9
        best, med = _best(lambda: ck._int8_linear(xs[576], head_q, head_s), args.reps)
        r["q8_head_ms"] = best * 1e3
        r["q8_head_GBps"] = head_bytes / best / 1e9

        def all_layers_a8():  # the int8-activation kernels (GGUF decode rows since session 4)
            for lay in layers:
                for (w, s, z), (_, k) in zip(lay, LAYER_SHAPES):
                    a8.int4_linear(xs[k], w, s, z)
        best, med = _best(all_layers_a8, args.reps)
        r["q4a8_all_layers_ms"] = best * 1e3
        r["q4a8_all_layers_median_ms"] = med * 1e3
        r["q4a8_GBps"] = q4_bytes / best / 1e9
        best, med = _best(lambda: a8.int8_linear(xs[576], head_q, head_s), args.reps)
        r["q8a8_head_ms"] = best * 1e3
        r["q8a8_head_GBps"] = head_bytes / best / 1e9
        n_calls = 2000
        ck._int4_linear(x_tiny, *tiny), ck._int4_op(x_tiny, *tiny)  # first calls pay one-time set-up
        t0 = time.perf_counter()
        for _ in range(n_calls):
            ck._int4_linear(x_tiny, *tiny)
        r["per_call_us_direct"] = (time.perf_counter() - t0) / n_calls * 1e6
        t0 = time.perf_counter()
        for _ in range(n_calls):
            ck._int4_op(x_tiny, *tiny)
        r["per_call_us_custom_op"] = (time.perf_counter() - t0) / n_calls * 1e6
        op = torch.ops.octavo_cpu.int4_a8  # registered by cpu_int8act_ops
        a8.int4_linear(x_tiny, *tiny), op(x_tiny, *tiny)
        t0 = time.perf_counter()
        for _ in range(n_calls):
            a8.int4_linear(x_tiny, *tiny)
        r["per_call_us_a8_direct"] = (time.perf_counter() - t0) / n_calls * 1e6
        t0 = time.perf_counter()
        for _ in range(n_calls):
            op(x_tiny, *tiny)
        r["per_call_us_a8_library_op"] = (time.perf_counter() - t0) / n_calls * 1e6
        for m in args.rows:  # one weight per shape, reused: this compares the kernels, not the memory
            for (n, k), (w, s, z) in zip(LAYER_SHAPES[2:], layers[0][2:]):
                xm = torch.randn(m, k).bfloat16()
                reps = max(3, min(args.reps, 400 // m))
                args4 = (xm, w, s, z)
                r[f"rows{m}_{n}x{k}_a8_ms"] = _best(lambda a=args4: a8.int4_linear(*a), reps)[0] * 1e3
                r[f"rows{m}_{n}x{k}_before_ms"] = _best(lambda a=args4: ck._int4_linear(*a), reps)[0] * 1e3
            xm = torch.randn(m, HEAD[1]).bfloat16()
            reps = max(3, min(args.reps, 40 // m))
            args8 = (xm, head_q, head_s)
            r[f"rows{m}_head_a8_ms"] = _best(lambda a=args8: a8.int8_linear(*a), reps)[0] * 1e3
            r[f"rows{m}_head_before_ms"] = _best(lambda a=args8: ck._int8_linear(*a), reps)[0] * 1e3
        res["by_threads"][t] = r
        print(f"threads={t}: " + ", ".join(f"{k}={v:.2f}" for k, v in r.items()), flush=True)
    res["loadavg"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
