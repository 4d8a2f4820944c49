"""One MoE layer at batch 1 on the GPU: the two-launch path (routing fused into the w13 GEMV, the weighted sum
over k into the w2 GEMV; ``plugins/platforms/moe_decode_kernels.py``) against the general fused kernel with its
routing kernel (four launches), and a small tile search for the two-launch path.

    python benchmarks/moe_decode_bench.py [--shapes qwen3-30b-a3b mixtral-8x7b] [--json out.json] [--config-dir D]

Both paths start from the router logits (the router GEMV itself is not timed) and are graph-replayed: one CUDA
graph holds ``R`` calls over ``R`` routings that take disjoint expert sets (weights come from HBM, not L2),
divided by ``R``. ``roofline_fraction`` = (k routed experts' bytes / copy bandwidth measured in the same run) /
time. ``max_rel_err``: each path against the grouped torch path (torch routing). With ``--config-dir`` the best
tiles found are merged into the shape's config file there (the ``"decode"`` entry of ``M=1``), which engines
started with ``OCTAVO_MOE_CONFIG_DIR`` pointing at it then use.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_bench import SHAPES, _graph_us, copy_bandwidth_gbps  # noqa: E402

# (BLOCK_N, BLOCK_K, num_warps, num_stages[, ALL_SLOTS]), likeliest first: each new tile costs a Triton
# compile (~1 s). ALL_SLOTS: one w13 program covers all k slots' rows (a [k, BLOCK_N, BLOCK_K] tile).
W13_TILES = [(2, 256, 4, 3, True), (16, 256, 4, 4), (4, 256, 8, 3, True), (16, 512, 8, 3), (4, 128, 4, 4, True),
             (8, 256, 4, 4), (2, 512, 8, 3, True), (32, 256, 8, 3)]
W2_TILES = [(4, 512, 8, 3), (8, 128, 8, 4), (2, 512, 4, 3), (4, 256, 8, 4), (8, 256, 8, 3), (16, 256, 8, 3)]


def _cases(e, k, h, reps, dtype, gen):
    """(x, logits) pairs whose top-k are disjoint expert sets while the experts last."""
    perm = torch.randperm(e, generator=gen)
    out = []
    for r in range(reps):
        chosen = perm[(r * k) % (e - e % k):(r * k) % (e - e % k) + k]
        logits = torch.randn(1, e, generator=gen)
        logits[0, chosen] = 8.0 + torch.rand(k, generator=gen)  # these k win, in a random order
        out.append((torch.randn(1, h, generator=gen).to(dtype).cuda(), logits.to(dtype).cuda()))
    return out


def bench_shape(name, e, k, h, inter, bw_gbps, budget_s, dtype=torch.bfloat16) -> dict:
    from octavo.nn.fused_moe import FusedMoE
    from octavo.plugins.platforms import cuda_moe
    from octavo.plugins.platforms.moe_decode_kernels import decode_one, default_decode_config

    torch.manual_seed(0)
    layer = FusedMoE(e, k, h, inter, prefix=name)
    layer.w13_weight.data = torch.randn(e, 2 * inter, h, device="cuda", dtype=dtype) * h ** -0.5
    layer.w2_weight.data = torch.randn(e, h, inter, device="cuda", dtype=dtype) * inter ** -0.5
    cuda_moe.use_triton_kernel(layer)
    w13, w2 = layer.w13_weight, layer.w2_weight
    gen = torch.Generator().manual_seed(0)
    cases = _cases(e, k, h, max(2, min(16, e // k)), dtype, gen)
    roof_us = k * 3 * h * inter * w13.element_size() / (bw_gbps * 1e3)

    def general(x, logits):
        w, ids = layer.select_experts(logits)
        return layer.apply_experts(x, w, ids)

    def two(cfg, x, logits):
        return decode_one(x, logits, w13, w2, k, True, cfg)[0]

    def err(fn):
        x, logits = cases[0]
        w, ids = type(layer).select_experts(layer, logits.float())
        want = type(layer).apply_experts(layer, x, w, ids).float()
        return round(float((fn(x, logits).float() - want).abs().max() / want.abs().max()), 5)

    res = {"E": e, "top_k": k, "hidden": h, "inter": inter, "roofline_us": round(roof_us, 2)}
    res["general_us"] = round(_graph_us([functools.partial(general, *c) for c in cases]), 2)
    res["general_max_rel_err"] = err(general)
    default = default_decode_config(k, inter, h)
    res["default_config"] = default
    res["two_launch_default_us"] = round(_graph_us([functools.partial(two, default, *c) for c in cases]), 2)
    res["two_launch_max_rel_err"] = err(functools.partial(two, default))
    best, best_us, tried = default, res["two_launch_default_us"], []
    for part, tiles in (("w13", W13_TILES), ("w2", W2_TILES)):  # coordinate search: w13 first, then w2
        t0 = time.time()  # 60% of the budget for w13, 40% for w2
        for bn, bk, warps, stages, *all_slots in tiles:
            if time.time() - t0 > budget_s * (0.6 if part == "w13" else 0.4):
                break
            cfg = {**best, part: {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages,
                                  **({"ALL_SLOTS": True} if all_slots else {})}}
            if cfg == best:
                continue
            try:
                us = _graph_us([functools.partial(two, cfg, *c) for c in cases])
            except Exception as ex:  # noqa: BLE001 - a tile this card cannot run: skip it
                tried.append({part: [bn, bk, warps, stages, *all_slots], "error": f"{type(ex).__name__}"})
                continue
            tried.append({part: [bn, bk, warps, stages, *all_slots], "us": round(us, 2)})
            if us < best_us:
                best, best_us = cfg, us
    res["search"] = tried
    res["best_config"] = best
    res["two_launch_best_us"] = round(best_us, 2)
    res["two_launch_best_max_rel_err"] = err(functools.partial(two, best))
    res["roofline_fraction_general"] = round(roof_us / res["general_us"], 3)
    res["roofline_fraction_two_launch"] = round(roof_us / best_us, 3)
    print(f"{name}: {json.dumps(res)}", flush=True)
    return res


def merge_decode_config(config_dir: str, e: int, k: int, inter: int, dtype: torch.dtype, best: dict) -> str:
    """Write ``best`` as the ``"decode"`` entry of ``M=1`` in the shape's config file under ``config_dir``."""
    from octavo.plugins.platforms import cuda_moe

    path = os.path.join(config_dir, cuda_moe.config_file_name(e, inter, torch.cuda.get_device_name(), dtype))
    table = json.load(open(path)) if os.path.exists(path) else {}
    entry = table.setdefault("1", cuda_moe.default_config(1, e, k, inter))
    entry["decode"] = best
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
    return path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["qwen3-30b-a3b", "mixtral-8x7b"])
    ap.add_argument("--json")
    ap.add_argument("--config-dir", help="merge the best tiles into the shape's config file here")
    ap.add_argument("--budget-s", type=float, nargs="+", default=[6.0],
                    help="tile search seconds per shape (one value for all, or one per --shapes entry)")
    args = ap.parse_args(argv)
    bw = copy_bandwidth_gbps()
    report = {"device": torch.cuda.get_device_name(), "copy_bandwidth_GBps": round(bw, 1),
              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "shapes": {}}
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    budgets = args.budget_s * len(args.shapes) if len(args.budget_s) == 1 else args.budget_s
    for name, budget in zip(args.shapes, budgets):
        e, k, h, inter = SHAPES[name]
        res = report["shapes"][name] = bench_shape(name, e, k, h, inter, bw, budget)
        torch.cuda.empty_cache()
        if args.config_dir:
            res["config_file"] = merge_decode_config(args.config_dir, e, k, inter, torch.bfloat16, res["best_config"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
