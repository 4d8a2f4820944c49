"""A/B of the quantizing RMSNorm in the consuming GEMV's prologue (plugins/quant/fp8_norm_gemv.py) against the norm
kernel + one-row GEMV it would replace, in the batch-1 chain's launch settings (PDL, the table tiles), one H100.

Each CUDA graph holds ``--layers`` links of: o_proj's GEMV (4096 x 4096, its own weight per link, as the forward) ->
[``rms_norm_quant`` -> the consumer's GEMV] (``two``) or [``norm_gemv``] (``fused``, ``--programs`` per SM), for the
qkv (6144 x 4096) and gate_up (28672 x 4096) shapes; graphs replayed alternately, median per link. The o_proj GEMV in
front makes the norm wait for a producer as in the forward (its PDL chain). Prints and writes JSON (``--out``).

    python benchmarks/fp8_norm_gemv_bench.py --layers 16 --rounds 5 --out norm_gemv.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench_shape(args, n: int, sms: int, dev) -> dict:
    """us a link (o_proj GEMV -> norm -> consumer GEMV, or o_proj GEMV -> norm_gemv) for a consumer of ``n`` rows."""
    import torch

    from octavo.plugins.quant.fp8_fused import rms_norm_quant
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from octavo.plugins.quant.fp8_norm_gemv import norm_gemv

    g = torch.Generator(device=dev).manual_seed(0)
    k, e4m3 = 4096, torch.float8_e4m3fn
    wo = [torch.randn(k, k, device=dev, generator=g).mul(40).clamp(-448, 448).to(e4m3) for _ in range(args.layers)]
    wc = [torch.randn(n, k, device=dev, generator=g).mul(40).clamp(-448, 448).to(e4m3) for _ in range(args.layers)]
    wso, wsc = torch.full((k,), 1e-3, device=dev), torch.full((n,), 1e-3, device=dev)
    nw = torch.rand(k, device=dev, generator=g).add(0.5).to(torch.bfloat16)
    x0 = torch.randn(1, k, device=dev, generator=g).to(torch.bfloat16)
    r0 = torch.randn(1, k, device=dev, generator=g).to(torch.bfloat16)
    o_kw = dict(config=(16, 1024, 8, 3), pdl=True, pdl_w=1, loop2=2)
    c_kw = dict(config=(4, 1024, 4, 3), pdl=True, pdl_w=1)

    def two():
        for i in range(args.layers):
            h = fp8_gemv(x0, wo[i], wso, **o_kw)
            out, ro, q, s = rms_norm_quant(h, nw, 1e-5, r0)
            fp8_gemv(q, wc[i], wsc, x_scale=s, out_dtype=torch.bfloat16, **c_kw)

    def fused(per_sm):
        def run():
            for i in range(args.layers):
                h = fp8_gemv(x0, wo[i], wso, **o_kw)
                norm_gemv(h, r0, nw, 1e-5, wc[i], wsc, programs=per_sm * sms, pdl=True)
        return run

    modes = {"two": two, **{f"fused_p{p}": fused(int(p)) for p in args.programs.split(",")}}
    graphs = {}
    for tag, fn in modes.items():
        fn()  # compile outside the graph
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            fn()
        graphs[tag] = gr
    times = {t: [] for t in graphs}
    for _ in range(args.rounds):  # the modes alternate
        for tag, gr in graphs.items():
            gr.replay()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                gr.replay()
            torch.cuda.synchronize()
            times[tag].append((time.perf_counter() - t0) / 10 / args.layers * 1e6)
    return {t: {"us_per_link_median": round(statistics.median(v), 2), "all": [round(x, 2) for x in v]}
            for t, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--programs", default="3,4", help="programs an SM for the fused kernel (comma list)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res = {"card": torch.cuda.get_device_name(), "layers": args.layers, "sms": sms}
    for name, n in (("qkv", 6144), ("gate_up", 28672)):
        res[name] = bench_shape(args, n, sms, dev)
        base = res[name]["two"]["us_per_link_median"]
        for t, v in res[name].items():
            print(f"{name:8s} {t:10s} {v['us_per_link_median']:8.2f} us a link ({v['us_per_link_median'] - base:+.2f})",
                  flush=True)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
