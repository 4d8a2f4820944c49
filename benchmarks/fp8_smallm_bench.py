"""fp8 projections at 2-64 rows: ``torch._scaled_mm`` (the engine's path above one row) vs the tensor-core GEMV of
plugins/quant/fp8_gemv_tc.py on BLOCK_M 16 / 32 / 64 (issue 9, session 9).

Why: the 512 x 1000/1000 fp8 run ends with ~1,000 steps of a few dozen rows (the requests the KV cache could not
hold at once), where every step reads the 7 GB of fp8 weights; session 3 measured ``_scaled_mm`` at 0.52-0.61 of
the copy bandwidth from 1 to 64 rows, the tensor-core GEMV 1.2-1.8x faster at 2-16 rows. Per Llama-3-8B projection
and row count: us per call in a CUDA graph of calls cycling weight copies > 2x the 50 MB L2 (as a 32-layer forward
reads them), the fraction of ``--peak`` bytes/s, and the error vs the float64 product of the same e4m3 operands
(max |y - ref| / max |ref|; ``_scaled_mm`` exact, the fp8 MMA at BLOCK_M >= 32 accumulates imprecisely on Hopper).
Inputs prequantized (the engine's producers hand the GEMM e4m3 rows). Compiles run first in a process pool.

    python benchmarks/fp8_smallm_bench.py --out /tmp/smallm.json --budget 30 [--rows 16,40,64] [--max-bm 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.fp8_gemv_bench import graph_time  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
# (dot, (BLOCK_N, BLOCK_K, warps, stages, BLOCK_M)); BLOCK_M is raised to cover the rows where needed
TC = [("f16", (32, 256, 4, 3, 64)), ("f16", (64, 256, 4, 3, 64)), ("f16", (32, 512, 4, 3, 64)),
      ("f16", (64, 128, 4, 4, 64)), ("f16", (16, 512, 4, 3, 64)), ("fp8", (64, 256, 4, 3, 64)),
      ("f16", (32, 512, 4, 3, 32)), ("f16", (16, 512, 4, 3, 16))]


def _tc(dot, cfg, xq, xs, w, ws):
    from octavo.plugins.quant.fp8_gemv_tc import fp8_gemv_tc

    return fp8_gemv_tc(xq, w, ws, x_scale=xs, out_dtype=torch.bfloat16, config=cfg, dot_fp8=dot == "fp8")


def _mm(xq, xs, w, ws):
    return torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws.reshape(1, -1), out_dtype=torch.bfloat16)


def _inputs(n, k, rows, copies, seed=0):
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    g = torch.Generator(device="cuda").manual_seed(seed)
    ws_ = [quantize_fp8_rows(torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16))
           for _ in range(copies)]
    xq, xs = quantize_per_token(torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16))
    return xq, xs, ws_


def _warm(jobs):
    done = 0
    for rows, dot, cfg in jobs:
        xq, xs, [(w, ws)] = _inputs(256, 2048, rows, 1)
        try:
            _tc(dot, cfg, xq, xs, w, ws)
            done += 1
        except Exception:  # noqa: BLE001 - the timed run records it
            pass
    torch.cuda.synchronize()
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--rows", default="16,40,64")
    ap.add_argument("--peak", type=float, default=3.35e12)
    ap.add_argument("--max-bm", type=int, default=64, help="leave out tiles of a larger BLOCK_M")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows_list = [int(r) for r in args.rows.split(",")]
    res: dict = {"command": "python " + " ".join(sys.argv), "card": torch.cuda.get_device_name(), "rows": {}}

    def fits(rows, cfg):
        return rows <= cfg[4] <= args.max_bm

    jobs = sorted({(r, dot, cfg) for r in rows_list for dot, cfg in TC if fits(r, cfg)})
    # Triton specializes M on == 1 / % 16: one compile per (dot, cfg, class of rows)
    t = time.perf_counter()
    pool = cf.ProcessPoolExecutor(8, mp_context=mp.get_context("spawn"))
    try:
        futs = [pool.submit(_warm, jobs[i::8]) for i in range(8)]
        done = sum(f.result(timeout=max(0.1, t + args.budget * 0.45 - time.perf_counter())) for f in futs)
        res["prewarm"] = {"compiled": done, "of": len(jobs), "s": round(time.perf_counter() - t, 1)}
    except Exception as e:  # noqa: BLE001
        res["prewarm"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    pool.shutdown(wait=False, cancel_futures=True)
    print("prewarm", res["prewarm"], flush=True)

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for name, (n, k) in SHAPES.items():
        copies = max(2, math.ceil(2 * 50e6 / (n * k)) + 1)
        for rows in rows_list:
            if time.perf_counter() - t0 > args.budget:
                res["rows"].setdefault(str(rows), {})[name] = "skipped: budget"
                continue
            xq, xs, wl = _inputs(n, k, rows, copies)
            ref = (xq.double() * xs.double()) @ (wl[0][0].double() * wl[0][1].double()[:, None]).t()
            scale = float(ref.abs().max())
            row = res["rows"].setdefault(str(rows), {}).setdefault(name, {})
            variants = [("scaled_mm", None, None)] + [("tc", dot, cfg) for dot, cfg in TC if fits(rows, cfg)]
            for kind, dot, cfg in variants:
                label = kind if kind == "scaled_mm" else f"tc_{dot}_" + "x".join(map(str, cfg))
                try:
                    if kind == "scaled_mm":
                        fns = [lambda w=w, s=s, a=xq, b=xs: _mm(a, b, w, s) for w, s in wl]
                        y = _mm(xq, xs, *wl[0])
                    else:
                        fns = [lambda w=w, s=s, d=dot, c=cfg, a=xq, b=xs: _tc(d, c, a, b, w, s) for w, s in wl]
                        y = _tc(dot, cfg, xq, xs, *wl[0])
                    sec = graph_time(fns)
                    row[label] = {"us": round(sec * 1e6, 2), "of_peak": round(n * k / sec / args.peak, 3),
                                  "err": float((y.double() - ref).abs().max()) / scale}
                except Exception as e:  # noqa: BLE001
                    row[label] = {"error": f"{type(e).__name__}: {e}"[:200]}
            best = min((v["us"], k_) for k_, v in row.items() if isinstance(v, dict) and "us" in v
                       and (k_ == "scaled_mm" or v["err"] < 5e-3))
            print(f"{time.perf_counter() - t0:5.1f}s {name:8s} rows {rows:3d} scaled_mm "
                  f"{row.get('scaled_mm', {}).get('us')} us, best {best}", flush=True)
            del wl
            save()
    res["seconds"] = round(time.perf_counter() - t0, 1)
    save()


if __name__ == "__main__":
    main()
