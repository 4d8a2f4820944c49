"""One MoE layer on the GPU: the Triton fused kernel against the grouped torch path, and the batch-1
fraction of the memory roofline over the bytes of the experts actually read.

    python benchmarks/moe_bench.py [--shapes mixtral-8x7b qwen3-30b-a3b] [--batch-sizes 1 16 256] [--json out.json]

Per shape (random bf16 weights, uniform random routing) and token count M it reports, in microseconds per
layer call (``FusedMoE.apply_experts``: routing weights/ids given; the router GEMM and top-k are not timed):

- ``torch_us``: the grouped torch path (``FusedMoE.apply_experts`` of the class: one host read of the counts,
  a matmul pair per expert with tokens), eager;
- ``triton_eager_us``: the kernel, eager (5 launches: align, w13, w2, sum, plus allocations);
- ``triton_graph_us``: the kernel replayed from one CUDA graph that holds ``R`` calls over ``R`` different
  routings (what a captured decode step sees: no launch gaps), divided by ``R``;
- ``torch_static_graph_us`` (M = 1): ``FusedMoE.apply_experts_static`` graph-replayed, the graph-safe torch
  path that captured decode steps ran before this kernel (every expert on every token);
- ``max_rel_err``: kernel vs torch path, max |diff| / max |torch|;
- ``breakdown`` (M=1): align (none at batch 1: direct layout), w13, w2 and the sum over k, each
  graph-replayed alone, with the GEMMs' GB/s;
- ``routing_torch_graph_us`` / ``routing_triton_graph_us`` (M=1): ``select_experts`` (softmax, top-k,
  renormalise) as torch's launches and as the one Triton kernel, graph-replayed;
- ``active_bytes``: expert weight bytes the call must read (distinct experts routed x 3 x H x I x 2 bytes);
  ``roofline_fraction_graph`` = (active_bytes / measured bandwidth) / triton_graph_us.

Weights stay cold: the routings cycle through disjoint expert sets where the shape allows (batch 1), so the
experts of consecutive calls differ and come from HBM, not L2. Bandwidth is measured in the same run as a
device-to-device copy of 2 GiB (read + write bytes / time).
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch

DEVICE = "cuda"  # a CPU dry run (TRITON_INTERPRET=1, fake timers) sets "cpu"
SHAPES = {"mixtral-8x7b": (8, 2, 4096, 14336), "qwen3-30b-a3b": (128, 8, 2048, 768)}


def _time_us(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def copy_bandwidth_gbps(nbytes: int = 2 << 30) -> float:
    """Device memory bandwidth as a large device-to-device copy achieves it (read + write)."""
    bufs = [torch.empty(nbytes, dtype=torch.uint8, device=DEVICE) for _ in range(2)]
    us = _time_us(lambda: bufs[1].copy_(bufs[0]), 10)
    bufs.clear()
    torch.cuda.empty_cache()
    return 2 * nbytes / (us * 1e-6) / 1e9


def _cycling(fn, cases):
    """A no-argument callable running ``fn(*case)`` over ``cases`` round-robin."""
    state = [0]

    def call():
        case = cases[state[0] % len(cases)]
        state[0] += 1
        return fn(*case)

    return call


def _routings(e, k, m, count, gen):
    """``count`` (ids) routings of ``m`` tokens; at m=1 they take disjoint expert sets while experts last."""
    out = []
    perm = torch.randperm(e, generator=gen)
    for r in range(count):
        if m == 1 and (r + 1) * k <= e:
            ids = perm[r * k:(r + 1) * k].view(1, k)
        else:
            ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)])
        out.append(ids)
    return out


def _graph_us(calls) -> float:
    """Per-call time of the no-argument ``calls`` captured one after another into one CUDA graph."""
    for call in calls:
        call()  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    us = _time_us(graph.replay, 5) / len(calls)
    del graph
    return us


def breakdown(layer, cases, cfg) -> dict:
    """Each of the kernel's four launches alone (graph-replayed over the same cases), with the weight
    bandwidth of the two GEMMs: where a batch-1 call's time goes."""
    from octavo.plugins.platforms.cuda_moe_kernels import _gemm, moe_layout

    c13, c2 = cfg[0], {**cfg[0], **(cfg[1] or {})}
    e, h, inter, k = layer.num_local_experts, layer.hidden_size, layer.intermediate_size, layer.top_k
    bm = c13["BLOCK_M"]
    prep = []
    for x, w, ids in cases:
        slots = x.shape[0] * k
        prep.append((x, w.reshape(-1).contiguous(), ids, moe_layout(ids, e, bm, x.shape[0] == 1), slots,
                     torch.empty(slots, inter, dtype=x.dtype, device=x.device),
                     torch.empty(slots, h, dtype=x.dtype, device=x.device),
                     torch.empty(x.shape[0], h, dtype=x.dtype, device=x.device)))
    w13, w2 = layer.w13_weight, layer.w2_weight
    # batch 1 has no align launch (direct layout): its time is 0 then
    align = 0.0 if prep[0][3][1] is None else _graph_us([functools.partial(moe_layout, p[2], e, bm, False)
                                                          for p in prep])
    g13 = _graph_us([functools.partial(_gemm, p[0], w13, p[5], p[1], p[3], p[4], inter, h, k, True, False, c13)
                     for p in prep])
    g2 = _graph_us([functools.partial(_gemm, p[5], w2, p[6], p[1], p[3], p[4], h, inter, 1, False, True, c2)
                    for p in prep])
    total = _graph_us([functools.partial(torch.sum, p[6].view(-1, k, h), 1, out=p[7]) for p in prep])
    distinct = sum(int(torch.unique(p[2]).numel()) for p in prep) / len(prep)
    b13, b2 = distinct * 2 * inter * h * w13.element_size(), distinct * h * inter * w2.element_size()
    return {"align_us": round(align, 2), "w13_us": round(g13, 2), "w2_us": round(g2, 2), "sum_us": round(total, 2),
            "w13_GBps": round(b13 / g13 / 1e3, 1), "w2_GBps": round(b2 / g2 / 1e3, 1)}


def bench_shape(name, e, k, h, inter, batch_sizes, bandwidth_gbps, dtype=torch.bfloat16) -> dict:
    from octavo.nn.fused_moe import FusedMoE
    from octavo.plugins.platforms import cuda_moe

    torch.manual_seed(0)
    layer = FusedMoE(e, k, h, inter, prefix=name)
    layer.w13_weight.data = (torch.randn(e, 2 * inter, h, device=DEVICE, dtype=dtype) * h ** -0.5)
    layer.w2_weight.data = (torch.randn(e, h, inter, device=DEVICE, dtype=dtype) * inter ** -0.5)
    reason = cuda_moe.unsupported_reason(layer, torch.device(DEVICE))
    assert reason is None, reason
    cuda_moe.use_triton_kernel(layer)
    torch_apply = type(layer).apply_experts
    expert_bytes = 3 * h * inter * layer.w13_weight.element_size()
    gen = torch.Generator().manual_seed(0)
    results = {}
    for m in batch_sizes:
        reps = max(2, min(16, e // k)) if m == 1 else 4
        cases = []
        for ids in _routings(e, k, m, reps, gen):
            w = torch.rand(m, k, generator=gen)
            cases.append((torch.randn(m, h, generator=gen).to(dtype).to(DEVICE), (w / w.sum(-1, keepdim=True)).to(DEVICE),
                          ids.to(DEVICE)))
        want = torch_apply(layer, *cases[0]).float()
        got = layer.apply_experts(*cases[0]).float()
        err = float((got - want).abs().max() / want.abs().max())
        torch_us = _time_us(_cycling(functools.partial(torch_apply, layer), cases), 3 * reps)
        eager_us = _time_us(_cycling(layer.apply_experts, cases), 3 * reps)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for case in cases:
                layer.apply_experts(*case)
        graph_us = _time_us(graph.replay, 5) / reps
        del graph
        distinct = sum(int(torch.unique(case[2]).numel()) for case in cases) / reps  # experts read per call
        active = int(distinct * expert_bytes)
        roof_us = active / (bandwidth_gbps * 1e9) * 1e6
        cfg = layer._moe_cfg_cache[m]
        results[m] = {"torch_us": round(torch_us, 1), "triton_eager_us": round(eager_us, 1),
                      "triton_graph_us": round(graph_us, 1), "speedup_eager": round(torch_us / eager_us, 2),
                      "speedup_graph": round(torch_us / graph_us, 2), "max_rel_err": round(err, 5),
                      "active_bytes": active, "roofline_us": round(roof_us, 1),
                      "roofline_fraction_graph": round(roof_us / graph_us, 3),
                      "roofline_fraction_eager": round(roof_us / eager_us, 3), "config": cfg[0], "w2_config": cfg[1],
                      "config_source": "file" if layer._moe_table else "default"}
        if m == 1:  # what CUDA-graph decode ran before the kernel: every expert on every token
            static = functools.partial(type(layer).apply_experts_static, layer)
            static_us = _graph_us([functools.partial(static, *case) for case in cases[:4]])
            results[m]["torch_static_graph_us"] = round(static_us, 1)
            results[m]["speedup_vs_static_graph"] = round(static_us / graph_us, 2)
        if m == 1:
            results[m]["breakdown"] = breakdown(layer, cases, cfg)
            # routing (softmax, top-k, renormalise) of one token: torch's launches vs the Triton kernel
            logits = [torch.randn(1, e, generator=gen).to(dtype).to(DEVICE) for _ in range(4)]
            results[m]["routing_torch_graph_us"] = round(_graph_us(
                [functools.partial(type(layer).select_experts, layer, lg) for lg in logits]), 2)
            results[m]["routing_triton_graph_us"] = round(_graph_us(
                [functools.partial(layer.select_experts, lg) for lg in logits]), 2)
        print(f"{name} M={m}: {results[m]}", flush=True)
    del layer
    torch.cuda.empty_cache()
    return {"E": e, "top_k": k, "hidden": h, "inter": inter, "dtype": str(dtype)[6:], "by_tokens": results}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tune-budget-s", type=float, default=0.0,
                    help="first tune each shape (benchmarks/moe_tune.py, quick search) for this many seconds in all")
    ap.add_argument("--tune-batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--tune-shapes", nargs="+", choices=sorted(SHAPES), help="tune only these (default: --shapes)")
    ap.add_argument("--tune-out", help="where tuned config files go (then used by this run)")
    args = ap.parse_args(argv)
    t0 = time.time()
    tuned = {}
    if args.tune_budget_s > 0:
        import os
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        import moe_tune

        from octavo.plugins.platforms import cuda_moe

        out_dir = args.tune_out or str(cuda_moe.CONFIG_DIR)
        tune_shapes = args.tune_shapes or args.shapes
        for name in tune_shapes:
            tuned[name] = moe_tune.tune_shape(*SHAPES[name], args.tune_batch_sizes,
                                              budget_s=args.tune_budget_s / len(tune_shapes), out_dir=out_dir,
                                              device=DEVICE)
        os.environ["OCTAVO_MOE_CONFIG_DIR"] = out_dir
        cuda_moe.load_configs.cache_clear()
        print(f"tuned in {time.time() - t0:.1f} s", flush=True)
    bw = copy_bandwidth_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    from octavo.plugins.platforms.cuda_moe import _device_name

    report = {"device": _device_name(torch.device(DEVICE)), "torch": torch.__version__,
              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "copy_bandwidth_GBps": round(bw, 1),
              "shapes": {}}
    import triton

    report["triton"] = triton.__version__
    report["tuned"] = {name: {str(m): r for m, r in res.items()} for name, res in tuned.items()}
    for name in args.shapes:
        report["shapes"][name] = bench_shape(name, *SHAPES[name], args.batch_sizes, bw)
        if args.json:  # partial results survive a timeout
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    report["seconds"] = round(time.time() - t0, 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
