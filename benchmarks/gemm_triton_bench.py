"""The decode step's projections at 64-256 rows: cuBLAS vs the Triton GEMM (``plugins/platforms/cuda_gemm.py``)
over a sweep of tiles and K splits, per weight shape of Qwen3-0.6B and Llama-3-8B (issue 17).

Timing: one CUDA graph per case holding a chain of launches over ``copies`` copies of the weight (>= 160 MB in
all, so weights come from HBM as in a model's layer chain, not from L2), replayed; the median of 5 replays / the
launches = us per projection. The Triton launches use programmatic dependent launch as the engine would
(``cuda_pdl.launch_opts()``); the best config is also timed without it. Every config's output is checked
against float64 (max |diff| / max |out|) before it is timed; a config over 1e-2 is reported, never chosen.
Prints one JSON line per (shape, rows) and writes the record after each (``gemm_table_from_bench.py`` turns it
into ``cuda_gemm.TABLE`` entries). ``--budget``: seconds for starting new cases, counted after the first case
(which builds every config).

    python benchmarks/gemm_triton_bench.py --out /tmp/gemm_triton.json [--budget 45]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {  # name: (N, K) of the weight [N, K]
    "nano_qkv": (4096, 1024), "nano_o": (1024, 2048), "nano_gate_up": (6144, 1024), "nano_down": (1024, 3072),
    "8b_qkv": (6144, 4096), "8b_o": (4096, 4096), "8b_gate_up": (28672, 4096), "8b_down": (4096, 14336),
    "nano_lm_head": (151936, 1024),  # (its fp32 copy could fold into a GEMM epilogue: sdk/nn/embedding.py)
    "8b_lm_head": (128256, 4096),  # Llama-3-8B's head (cuda_gemm.LOGITS_TABLE candidate, session 10)
}
DRY = False
ROWS = (206, 128, 256, 64, 32)  # the 8B run's ~206-row waves first, then the nano mean batch; 32 if time is left


def configs():
    from octavo.plugins.platforms.cuda_gemm import GemmConfig as C

    return [C(64, 64, 128, 1, 4, 4), C(64, 64, 128, 2, 4, 4), C(64, 64, 128, 4, 4, 4), C(64, 128, 64, 1, 4, 4),
            C(128, 128, 64, 1, 8, 3), C(128, 128, 64, 2, 8, 3), C(256, 64, 64, 1, 8, 3), C(64, 64, 64, 8, 4, 4),
            C(128, 256, 64, 1, 8, 3),
            C(64, 64, 64, 1, 4, 5, True), C(64, 64, 64, 4, 4, 5, True), C(128, 128, 64, 1, 8, 3, True),
            C(128, 256, 64, 1, 8, 3, True), C(128, 128, 64, 2, 8, 3, True), C(256, 128, 64, 1, 8, 3, True)]


def silu_configs():
    from octavo.plugins.platforms.cuda_gemm import GemmConfig as C

    return [C(64, 64, 128, 1, 4, 4), C(128, 64, 64, 1, 8, 3), C(128, 128, 64, 1, 8, 3), C(64, 128, 64, 1, 4, 4)]


def time_chain(fn, ws, launches: int) -> float:
    """us per call of ``fn(w)`` in a captured chain of ``launches`` calls cycling over ``ws``."""
    import torch

    if DRY:  # CPU interpreter: the code path only, host time
        t = time.perf_counter()
        for i in range(2):
            fn(ws[i % len(ws)])
        return (time.perf_counter() - t) * 1e6 / 2

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for w in ws:  # eager warm-up (builds) outside the capture
            fn(w)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(launches):
            fn(ws[i % len(ws)])
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / launches)
    del g
    return sorted(times)[2]


def main() -> None:
    import torch
    import torch.nn.functional as F

    from octavo.plugins.platforms.cuda_gemm import gemm
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=45.0)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    ap.add_argument("--dry", action="store_true", help="CPU, TRITON_INTERPRET=1, shapes / 64, two configs")
    args = ap.parse_args()
    global DRY
    DRY = args.dry
    t0 = time.perf_counter()
    first_case_s = 1e9  # until the first case (which builds every config) is done
    dev = torch.device("cpu" if DRY else "cuda")
    pdl = {} if DRY else launch_opts()
    res = {"card": "cpu (dry)" if DRY else torch.cuda.get_device_name(), "pdl": bool(pdl), "cases": [], "note": __doc__.split("\n\n")[1]}
    gen = torch.Generator(device=dev).manual_seed(0)
    cfgs = [configs()[0], configs()[9]] if DRY else configs()
    best_by_shape: dict = {}
    for m in args.rows:
        for name in args.shapes:
            n, k = SHAPES[name]
            if DRY:
                n, k = n // 64, k // 64 if k // 64 % 256 == 0 else 256
            if time.perf_counter() - t0 - first_case_s > args.budget:  # the first case's builds do not count
                res["cases"].append({"shape": name, "rows": m, "skipped": "budget"})
                continue
            copies = max(1, min(16, -(-160_000_000 // (n * k * 2))))
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * k ** -0.5
                  for _ in range(copies)]
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
            if DRY:  # the interpreter has no bf16 dots
                ws, x = [w.half() for w in ws], x.half()
            launches = max(32, copies * 2)
            ref = (x.double() @ ws[0].double().T)
            scale = float(ref.abs().max())
            row = {"shape": name, "rows": m, "N": n, "K": k, "copies": copies,
                   "cublas_us": round(time_chain(lambda w, x=x: F.linear(x, w), ws, launches), 2),
                   "cublas_err": float((F.linear(x, ws[0]).double() - ref).abs().max()) / scale, "triton": {}}
            for cfg in cfgs:
                if not cfg.fits(k) or time.perf_counter() - t0 - first_case_s > args.budget + 10:
                    continue
                try:
                    err = float((gemm(x, ws[0], cfg, pdl).double() - ref).abs().max()) / scale
                    us = time_chain(lambda w, c=cfg, x=x: gemm(x, w, c, pdl), ws, launches)
                    row["triton"][cfg.name()] = [round(us, 2), round(err, 5)]
                except Exception as e:  # noqa: BLE001 - a config this card cannot run (shared memory): record it
                    row["triton"][cfg.name()] = repr(e)[:160]
            ok = {c: v for c, v in row["triton"].items() if isinstance(v, list) and v[1] <= 1e-2}
            if ok:
                best = min(ok, key=lambda c: ok[c][0])
                row["best"], row["best_us"] = best, ok[best][0]
                row["speedup_vs_cublas"] = round(row["cublas_us"] / ok[best][0], 3)
                cfg = next(c for c in cfgs if c.name() == best)
                row["best_no_pdl_us"] = round(time_chain(lambda w, c=cfg, x=x: gemm(x, w, c, None), ws, launches), 2)
                if name.endswith("lm_head"):  # logits as the runner wants them: fp32 (cuBLAS + copy vs one pass)
                    row["cublas_float_us"] = round(time_chain(lambda w, x=x: F.linear(x, w).float(), ws, launches), 2)
                    row["best_float_us"] = round(time_chain(
                        lambda w, c=cfg, x=x: gemm(x, w, c, pdl, out_dtype=torch.float32), ws, launches), 2)
                best_by_shape.setdefault(name, {})[m] = (best, row["speedup_vs_cublas"])
            if name.endswith("gate_up"):  # + SiLU-and-mul: cuBLAS + the fused SiLU kernel vs one launch
                from octavo.plugins.platforms.cuda_fusions import silu_and_mul
                from octavo.plugins.platforms.cuda_gemm import GemmConfig
                from octavo.plugins.platforms.cuda_gemm_silu import gemm_silu

                row["cublas_silu_us"] = round(time_chain(lambda w, x=x: silu_and_mul(F.linear(x, w)), ws, launches), 2)
                want = silu_and_mul(F.linear(x, ws[0])).double()
                row["silu"] = {}
                for cfg in [GemmConfig(16, 16, 32, 1, 4, 2)] if DRY else silu_configs():
                    try:
                        err = float((gemm_silu(x, ws[0], cfg, pdl).double() - want).abs().max() / want.abs().max())
                        us = time_chain(lambda w, c=cfg, x=x: gemm_silu(x, w, c, pdl), ws, launches)
                        row["silu"][cfg.name()] = [round(us, 2), round(err, 5)]
                    except Exception as e:  # noqa: BLE001 - e.g. shared memory: record it
                        row["silu"][cfg.name()] = repr(e)[:160]
                good = {c: v for c, v in row["silu"].items() if isinstance(v, list) and v[1] <= 2e-2}
                if good:
                    row["silu_best"] = min(good, key=lambda c: good[c][0])
                    row["silu_speedup"] = round(row["cublas_silu_us"] / good[row["silu_best"]][0], 3)
            res["cases"].append(row)
            if first_case_s == 1e9:
                first_case_s = res["first_case_s"] = time.perf_counter() - t0
            res["best_by_shape"] = best_by_shape
            print(json.dumps({k2: v for k2, v in row.items() if k2 not in ("triton", "silu")}), flush=True)
            del ws, x
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
    res["seconds"] = time.perf_counter() - t0
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
