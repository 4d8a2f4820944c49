"""cuBLASLt's other candidates for the 8B projections at decode-step row counts (issue 17; session 12, engineer tput).

For each shape and row count: torch's ``F.linear`` (cuBLAS), the same through cuBLASLt's heuristic pick
(``preferred_blas_library("cublaslt")``), and every candidate cuBLASLt's heuristic returns
(``plugins/platforms/cuda_gemm_lt.py``: up to ``--count``, reduction schemes without in-place atomics), each timed as
``gemm_rows_bench.py --chain`` does (one CUDA graph of a chain of launches over weight copies beyond L2, median of 5
replays). Per candidate: its configuration attributes (what a table keys on), workspace, waves, whether two runs
give the same bits, its max |difference| to ``F.linear`` over max |output| and whether it equals it bit for bit.
One JSON line per case; the record is rewritten after each (``--budget``: seconds for starting new cases).

    python benchmarks/gemm_lt_bench.py --out /tmp/lt.json --shapes 8b_gate_up 8b_down --rows 264 272 --budget 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def case(lt, name: str, k: int, n: int, m: int, read: float, tflops: float, count: int, gen) -> dict:
    import torch
    import torch.nn.functional as F
    from gemm_triton_bench import time_chain

    from octavo.plugins.platforms.cuda_gemm_lt import describe

    dev = "cuda"
    copies = max(1, min(16, -(-160_000_000 // (n * k * 2))))
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * k ** -0.5 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
    launches = max(32, copies * 2) if m < 2048 else 8  # (a prefill chunk's GEMM runs 0.5-3 ms: fewer suffice)
    roof_us = max(n * k * 2 / read, 2 * m * n * k / (tflops * 1e12)) * 1e6
    row = {"shape": name, "rows": m, "K": k, "N": n, "copies": copies, "roofline_us": round(roof_us, 2)}
    ref = F.linear(x, ws[0])
    scale = float(ref.float().abs().max())
    prev = torch.backends.cuda.preferred_blas_library()
    try:
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            row[f"{lib}_us"] = round(time_chain(lambda w: F.linear(x, w), ws, launches), 2)
            row[f"{lib}_equal"] = bool(torch.equal(F.linear(x, ws[0]), ref))
    finally:
        torch.backends.cuda.preferred_blas_library(prev)
    cands = []
    for i, (algo, wsb, waves) in enumerate(lt.algos(m, n, k, torch.bfloat16, count)):
        c = {"index": i, "config": describe(algo), "workspace": wsb, "waves": round(waves, 3)}
        try:
            y1 = lt.matmul(x, ws[0], algo)
            y2 = lt.matmul(x, ws[0], algo)
            c["deterministic"] = bool(torch.equal(y1, y2))
            c["equal_cublas"] = bool(torch.equal(y1, ref))
            c["rel_diff"] = float((y1.float() - ref.float()).abs().max()) / max(scale, 1e-30)
            c["us"] = round(time_chain(lambda w, a=algo: lt.matmul(x, w, a), ws, launches), 2)
        except Exception as e:  # noqa: BLE001 - a candidate that does not run is reported, not fatal
            c["error"] = repr(e)[:200]
        cands.append(c)
    row["candidates"] = cands
    ok = [c for c in cands if "us" in c and c["deterministic"] and c["rel_diff"] <= 1.6e-2]
    if ok:
        best = min(ok, key=lambda c: c["us"])
        row["best_index"], row["best_us"] = best["index"], best["us"]
        row["best_vs_cublas"] = round(row["cublas_us"] / best["us"], 3)
    return row


def main() -> None:
    import torch
    from gemm_rows_bench import SHAPES

    from octavo.plugins.platforms.cuda_gemm_lt import LtGemm, library

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=40.0)
    ap.add_argument("--tflops", type=float, default=700.0)
    ap.add_argument("--count", type=int, default=16, help="heuristic candidates asked for")
    ap.add_argument("--rows", type=int, nargs="*", default=[264, 272, 248, 256])
    ap.add_argument("--shapes", nargs="*", default=["8b_gate_up", "8b_down", "8b_qkv", "8b_o"])
    args = ap.parse_args()
    t0 = time.perf_counter()
    lib = library()
    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32)  # the read rate: a 1 GiB sum
    src.sum()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        src.sum()
    b.record()
    b.synchronize()
    read = 5 * src.numel() * 4 / (a.elapsed_time(b) / 1e3)
    del src
    rec = {"card": torch.cuda.get_device_name(), "read_TBps": read / 1e12, "tflops_ceiling": args.tflops,
           "cublaslt_version": lib.cublasLtGetVersion() if hasattr(lib, "cublasLtGetVersion") else None,
           "sm_count": torch.cuda.get_device_properties(0).multi_processor_count, "cases": []}
    print(f"read {read / 1e12:.2f} TB/s, cuBLASLt {rec['cublaslt_version']}", flush=True)
    lt = LtGemm()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m in args.rows:
        for name in args.shapes:
            if time.perf_counter() - t0 > args.budget:
                break
            k, n = SHAPES[name]
            row = case(lt, name, k, n, m, read, args.tflops, args.count, gen)
            rec["cases"].append(row)
            brief = {key: v for key, v in row.items() if key != "candidates"}
            brief["top"] = sorted([(c["us"], c["index"]) for c in row["candidates"] if "us" in c])[:4]
            print(json.dumps(brief), flush=True)
            rec["seconds"] = time.perf_counter() - t0
            with open(args.out, "w") as f:
                json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
