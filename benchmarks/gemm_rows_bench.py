"""The projections of a decode step at tens to hundreds of rows (issue 17: at 206 rows the 8B step's non-attention
part took ~300 us a layer against a ~145 us roofline in session 7's batch 1; the nano step's GEMMs ran at ~1.2 TB/s):
how far cuBLAS is from the roofline per shape and row count, and whether cuBLASLt's heuristics
(``torch.backends.cuda.preferred_blas_library("cublaslt")``) pick faster kernels.

Each case: ``F.linear(x[M, K], W[N, K])`` in bf16, CUDA-graph median (``triton.testing.do_bench_cudagraph``);
roofline = max(weight bytes / read rate, FLOPs / dense bf16 rate) with the read rate measured in the same run
(a 1 GiB sum) and ``--tflops`` for the FLOP ceiling (H100 SXM dense bf16: ~700 measured by cuBLAS at large M in
session 1). Outputs of both libraries are compared (max |difference| / max |output|).

``--chain`` (session 9, engineer tput): time each case as ``gemm_triton_bench.time_chain`` does (one CUDA graph of a
chain of launches over weight copies beyond L2, so weights come from HBM as in a layer chain; a lone weight of the
8B qkv fits the 50 MB L2 and reads optimistic) and add ``cublas_t``: the same product with the operands swapped
(``W @ x^T``, out ``[N, M]``), so cuBLAS tiles the rows as its N dimension (any multiple of 8) instead of its M
(64-row MMA steps: 206 rows run as 256). Its output is compared with ``F.linear``'s transposed.

    python benchmarks/gemm_rows_bench.py --out /tmp/gemm_rows.json [--budget 40]
    python benchmarks/gemm_rows_bench.py --out /tmp/g.json --chain --shapes 8b_qkv 8b_o 8b_gate_up 8b_down \
        --rows 192 208 216 224 256
"""

from __future__ import annotations

import argparse
import functools
import json
import time

SHAPES = {  # name: (K, N) of the weight [N, K]
    "8b_qkv": (4096, 6144), "8b_o": (4096, 4096), "8b_gate_up": (4096, 28672), "8b_down": (14336, 4096),
    "nano_qkv": (1024, 4096), "nano_o": (2048, 1024), "nano_gate_up": (1024, 6144), "nano_down": (3072, 1024),
    "nano_lm_head": (1024, 151936), "8b_lm_head": (4096, 128256),
}
ROWS = (206, 128, 256, 64)  # most relevant first: the 8B run's ~206-row waves, the nano mean batch


def chain_case(name: str, k: int, n: int, m: int, read: float, tflops: float, gen) -> dict:
    """``--chain``: cuBLAS / cuBLASLt / operands swapped, us per launch in a captured chain over weight copies."""
    import torch
    import torch.nn.functional as F
    from gemm_triton_bench import time_chain

    dev = torch.device("cuda")
    copies = max(1, min(16, -(-160_000_000 // (n * k * 2))))
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * k ** -0.5 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
    launches = max(32, copies * 2)
    roof_us = max(n * k * 2 / read / 1e6, 2 * m * n * k / tflops / 1e6)
    row = {"shape": name, "rows": m, "K": k, "N": n, "copies": copies, "roofline_us": round(roof_us, 2)}
    ref = F.linear(x, ws[0]).float()
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        try:
            row[f"{lib}_us"] = round(time_chain(lambda w: F.linear(x, w), ws, launches), 2)
            row[f"{lib}_t_us"] = round(time_chain(lambda w: torch.mm(w, x.t()), ws, launches), 2)
            row[f"{lib}_t_rel_diff"] = float((torch.mm(ws[0], x.t()).t().float() - ref).abs().max()
                                             / ref.abs().max())
        except Exception as e:  # noqa: BLE001 - a library that cannot run here: record it
            row[f"{lib}_error"] = repr(e)[:200]
    torch.backends.cuda.preferred_blas_library("cublas")
    return row


def main() -> None:
    import torch
    import torch.nn.functional as F
    import triton.testing

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=40.0)
    ap.add_argument("--tflops", type=float, default=700.0)
    ap.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--chain", action="store_true", help="weights beyond L2 (a captured chain) + cublas_t")
    args = ap.parse_args()
    t0 = time.perf_counter()
    dev = torch.device("cuda")
    buf = torch.empty(2 ** 29, dtype=torch.bfloat16, device=dev)
    ms = triton.testing.do_bench_cudagraph(functools.partial(torch.sum, buf, dtype=torch.float32), rep=40,
                                           return_mode="median")
    read = buf.numel() * 2 / ms / 1e9  # TB/s
    del buf
    res = {"card": torch.cuda.get_device_name(), "read_TBps": read, "tflops_ceiling": args.tflops, "cases": []}
    print(f"read {read:.2f} TB/s", flush=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    for m in args.rows:
        for name in args.shapes:
            k, n = SHAPES[name]
            if args.chain:
                row = {"shape": name, "rows": m, "skipped": "budget"}
                if time.perf_counter() - t0 <= args.budget:
                    row = chain_case(name, k, n, m, read, args.tflops, gen)
                    print(json.dumps(row), flush=True)
                res["cases"].append(row)
                with open(args.out, "w") as f:
                    json.dump(res, f, indent=1)
                continue
            if time.perf_counter() - t0 > args.budget:
                res["cases"].append({"shape": name, "rows": m, "skipped": "budget"})
                continue
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * k ** -0.5
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
            roof_us = max(n * k * 2 / read / 1e6, 2 * m * n * k / args.tflops / 1e6)
            row = {"shape": name, "rows": m, "K": k, "N": n, "roofline_us": roof_us}
            outs = {}
            for lib in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(lib)
                try:
                    outs[lib] = F.linear(x, w)
                    t = triton.testing.do_bench_cudagraph(functools.partial(F.linear, x, w), rep=25,
                                                          return_mode="median") * 1e3
                    row[f"{lib}_us"] = t
                    row[f"{lib}_fraction_of_roofline"] = roof_us / t
                except Exception as e:  # noqa: BLE001 - a library that cannot run here: record it
                    row[f"{lib}_error"] = repr(e)[:200]
            torch.backends.cuda.preferred_blas_library("cublas")
            if len(outs) == 2:
                a, b = outs["cublas"].float(), outs["cublaslt"].float()
                row["max_rel_diff"] = float((a - b).abs().max() / a.abs().max())
            res["cases"].append(row)
            print(json.dumps({k2: (round(v, 3) if isinstance(v, float) else v) for k2, v in row.items()}), flush=True)
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
