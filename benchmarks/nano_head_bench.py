"""The decode step's tail on the Qwen3-0.6B shape: LM head + temperature sampling, per logits dtype and noise
(issue 17, session 9), one GPU, CUDA-graph timed (device time, no host launch cost).

Per row count (the nano-vllm run's decode batches) it times, each as one CUDA graph of ``--reps`` back-to-back
calls replayed ``--replays`` times (median, us per call):

  head_fp32_onepass  the LM head as the engine runs it: cuda_gemm's LOGITS_TABLE launch writes float32 logits
  head_bf16_cublas   ``F.linear`` (cuBLAS), bf16 logits
  head_bf16_triton   the same table launch writing bf16 (no float32 store)
  sample_<dt>_<noise>  ``fused_sample`` at temperature 0.6 over fp32 / bf16 logits, with the outer logarithm of
                     the Gumbel noise as ``lg2.approx`` (fast) or libdevice's accurate log2 (exact)

so "head + sampler" with float32 vs bf16 logits, and the noise's cost, are read side by side. The weight
(151,936 x 1,024 bf16, 311 MB) is far larger than L2; the logits of one call are what the next sampler reads.

    python benchmarks/nano_head_bench.py --out /tmp/head.json [--rows 64 128 206 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def graph_us(fn, reps: int, replays: int) -> float:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


def one_row(rows: int, w, args) -> dict:
    """Every timing of one row count (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    from octavo.plugins.platforms import cuda_gemm, cuda_sampler

    V, H = w.shape
    dev = w.device
    x = torch.randn(rows, H, device=dev).to(torch.bfloat16)
    temp = torch.full((rows,), 0.6, device=dev)
    cfg = cuda_gemm.lookup(rows, V, H, cuda_gemm.LOGITS_TABLE)
    row = {"rows": rows, "table_launch": cfg.name() if cfg else None}
    logits32 = cuda_gemm.gemm(x, w, cfg, out_dtype=torch.float32) if cfg else F.linear(x, w).float()
    logits16 = F.linear(x, w)
    # the one-pass float32 logits hold bf16 values; cuBLAS may round a few differently (summation order)
    row["onepass_vs_cublas_differing_share"] = float((logits32 != logits16.float()).float().mean())
    row["onepass_holds_bf16"] = bool(torch.equal(logits32, logits32.to(torch.bfloat16).float()))
    if cfg:
        row["head_fp32_onepass"] = graph_us(lambda: cuda_gemm.gemm(x, w, cfg, out_dtype=torch.float32),
                                            args.reps, args.replays)
        row["head_bf16_triton"] = graph_us(lambda: cuda_gemm.gemm(x, w, cfg), args.reps, args.replays)
    row["head_fp32_cublas_copy"] = graph_us(lambda: F.linear(x, w).float(), args.reps, args.replays)
    row["head_bf16_cublas"] = graph_us(lambda: F.linear(x, w), args.reps, args.replays)
    for fast in (True, False):
        cuda_sampler.FAST_LOG2 = fast
        name = "fast" if fast else "exact"
        for dt, lg in (("fp32", logits32), ("bf16", logits16)):
            row[f"sample_{dt}_{name}"] = graph_us(
                lambda lg=lg: cuda_sampler.fused_sample(lg, temp, None, base=2**40 + 3), args.reps, args.replays)
        # same keys, same logits: the two noises pick the same token on (nearly) every row
        a = cuda_sampler.fused_sample(logits32, temp, None, base=2**41 + rows)
        cuda_sampler.FAST_LOG2 = not fast
        b = cuda_sampler.fused_sample(logits32, temp, None, base=2**41 + rows)
        row["fast_vs_exact_same_token_share"] = float((a == b).float().mean())
    cuda_sampler.FAST_LOG2 = True
    return row


def main() -> None:
    import torch


    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 128, 206, 256])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    V, H = 151936, 1024
    w = (torch.randn(V, H, device=dev) * 0.02).to(torch.bfloat16)
    res = {"card": torch.cuda.get_device_name(), "command": " ".join(["python", *sys.argv]), "rows": []}
    for rows in args.rows:
        row = one_row(rows, w, args)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        res["rows"].append(row)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
