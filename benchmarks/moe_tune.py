"""Tune the fused MoE kernel's tiles for one MoE shape on this GPU and write its config file.

    python benchmarks/moe_tune.py --shape qwen3-30b-a3b --batch-sizes 1 16 256 [--full] [--budget-s 600]
    python benchmarks/moe_tune.py --experts 64 --top-k 6 --hidden 2048 --inter 1408 --out-dir /tmp/cfg

For each token count M it times the w13 GEMM (fused SiLU-and-mul) and the w2 GEMM separately over a few
BLOCK_M values (the layout they share), keeps the fastest tiles of each, and writes
``E=..,N=..,device_name=..,dtype=...json`` (merged with an existing file: other M entries stay) into
``--out-dir`` (default: the configs shipped in ``plugins/platforms/moe_configs``). The default config of
``cuda_moe.pick_config`` (no file) is always the first candidate, so a tuned entry is never slower than it as
measured here. Timing: ``triton.testing.do_bench`` (L2 flushed between calls: weights stream from HBM, as
in a decode step). ``--budget-s`` stops the search when spent and keeps the best found so far.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

SHAPES = {"mixtral-8x7b": (8, 2, 4096, 14336), "qwen3-30b-a3b": (128, 8, 2048, 768)}
SMEM_LIMIT = 200 * 1024  # bytes of shared memory a config may ask for (H100: 227 KB per block)


def _smem(bm, bn, bk, stages, gated):
    return stages * (bm * bk + (2 if gated else 1) * bk * bn) * 2


def candidates(bm: int, gated: bool, full: bool) -> list[dict]:
    """Tiles to try at one BLOCK_M (the quick set is a handful around what small/large M usually want)."""
    if full:
        grid = itertools.product((32, 64, 128, 256), (64, 128, 256), (1, 8), (4, 8), (2, 3, 4, 5))
    elif bm <= 16:
        grid = [(32, 256, 1, 4, 3), (16, 256, 1, 4, 4), (64, 128, 1, 4, 4), (32, 128, 1, 4, 4), (16, 128, 1, 4, 4),
                (128, 128, 1, 4, 3)]  # most likely first: a short budget stops the search
    else:
        grid = [(64, 64, 8, 4, 3), (128, 64, 8, 8, 3), (128, 128, 8, 8, 3), (64, 128, 8, 4, 4)]
    out = []
    for bn, bk, group, warps, stages in grid:
        if _smem(bm, bn, bk, stages, gated) <= SMEM_LIMIT:
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "num_warps": warps,
                        "num_stages": stages})
    return out


def block_ms(m: int, num_experts: int, top_k: int, full: bool) -> list[int]:
    per_expert = m * top_k / num_experts
    if per_expert <= 16:
        return [16, 32] if full else [16]
    if per_expert <= 48:
        return [16, 32, 64] if full else [16, 32]
    return [32, 64, 128] if full else [32, 64]


class Problem:
    """Random weights and a uniform random routing of ``m`` tokens for one shape."""

    def __init__(self, e, k, h, inter, dtype, device="cuda"):
        self.e, self.k, self.h, self.inter = e, k, h, inter
        self.w13 = (torch.randn(e, 2 * inter, h, device=device) * h ** -0.5).to(dtype)
        self.w2 = (torch.randn(e, h, inter, device=device) * inter ** -0.5).to(dtype)
        self.dtype, self.device = dtype, device

    def routing(self, m, seed=0):
        gen = torch.Generator(device=self.device).manual_seed(seed)
        logits = torch.randn(m, self.e, generator=gen, device=self.device)
        w, ids = torch.topk(torch.softmax(logits, -1), self.k, -1)
        x = torch.randn(m, self.h, generator=gen, device=self.device).to(self.dtype)
        return x, w / w.sum(-1, keepdim=True), ids


def _bench(fn) -> float:
    import triton

    try:
        return float(triton.testing.do_bench(fn, warmup=5, rep=20)) * 1e3  # us
    except Exception as e:  # noqa: BLE001 - a config this card cannot compile or launch
        print(f"    skip: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return float("inf")


def tune_m(p: Problem, m: int, full: bool, deadline: float) -> dict:
    """Best config for ``m`` tokens, with its timing and the default config's timing (us)."""
    from octavo.plugins.platforms.cuda_moe import pick_config
    from octavo.plugins.platforms.cuda_moe_kernels import _gemm, moe_layout

    x, w, ids = p.routing(m)
    slots = m * p.k
    act = torch.randn(slots, p.inter, device=p.device).to(p.dtype)
    out = torch.empty(slots, p.h, device=p.device, dtype=p.dtype)
    weights = w.reshape(-1).contiguous()
    default, w2_over = pick_config(None, m, p.e, p.k, p.inter, p.h)
    default2 = {**default, **(w2_over or {})}

    def t13(cfg, aligned):
        return _bench(lambda: _gemm(x, p.w13, act, weights, aligned, slots, p.inter, p.h, p.k, True, False, cfg))

    def t2(cfg, aligned):
        return _bench(lambda: _gemm(act, p.w2, out, weights, aligned, slots, p.h, p.inter, 1, False, True, cfg))

    direct = m == 1  # fused_experts' batch-1 layout (no align launch)
    aligned = moe_layout(ids, p.e, default["BLOCK_M"], direct)
    d13, d2 = t13(default, aligned), t2(default2, aligned)
    best = {"us": d13 + d2, "w13": default, "w2": default2}
    for bm in block_ms(m, p.e, p.k, full):
        aligned = moe_layout(ids, p.e, bm, direct)
        found = []
        for base, base_us in ((default, d13), (default2, d2)):
            found.append([base, base_us] if bm == default["BLOCK_M"] else [None, float("inf")])
        # w13 and w2 candidates alternate, so a budget that runs out has tried some of each
        queue = [(0, cfg) for cfg in candidates(bm, True, full)]
        queue2 = [(1, cfg) for cfg in candidates(bm, False, full)]
        mixed = [c for pair in itertools.zip_longest(queue, queue2) for c in pair if c is not None]
        for which, cfg in mixed:
            if time.monotonic() > deadline:
                break
            us = (t13 if which == 0 else t2)(cfg, aligned)
            if us < found[which][1]:
                found[which] = [cfg, us]
        (b13, u13), (b2, u2) = found
        if b13 is not None and b2 is not None and u13 + u2 < best["us"]:
            best = {"us": u13 + u2, "w13": b13, "w2": b2}
    entry = dict(best["w13"])
    w2 = {key: v for key, v in best["w2"].items() if key != "BLOCK_M" and entry.get(key) != v}
    if w2:
        entry["w2"] = w2
    return {"config": entry, "gemm_us": round(best["us"], 2), "default_gemm_us": round(d13 + d2, 2)}


def tune_shape(e, k, h, inter, batch_sizes, dtype=torch.bfloat16, full=False, budget_s=600.0, out_dir=None,
               device="cuda"):
    """Tune every M in ``batch_sizes`` and write (merge) the config file; returns the per-M report."""
    from octavo.plugins.platforms.cuda_moe import CONFIG_DIR, _device_name, config_file_name

    deadline = time.monotonic() + budget_s
    p = Problem(e, k, h, inter, dtype, device)
    name = _device_name(torch.device(device))
    report = {}
    for m in batch_sizes:
        report[m] = tune_m(p, m, full, deadline)
        print(f"  E={e} k={k} H={h} I={inter} M={m}: {report[m]}", flush=True)
    path = Path(out_dir or CONFIG_DIR) / config_file_name(e, inter, name, dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = json.loads(path.read_text()) if path.is_file() else {}
    table.update({str(m): r["config"] for m, r in report.items()})
    table["_meta"] = {"device": name, "hidden": h, "top_k": k, "dtype": str(dtype)[6:],
                      "tuned_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "search": "full" if full else "quick",
                      "budget_s": budget_s, "gemm_us_tuned_vs_default": {
                          str(m): [r["gemm_us"], r["default_gemm_us"]] for m, r in report.items()}}
    path.write_text(json.dumps(dict(sorted(table.items(), key=lambda kv: (not kv[0].isdigit(),
                                                                          int(kv[0]) if kv[0].isdigit() else 0))),
                               indent=1) + "\n")
    print(f"  wrote {path}", flush=True)
    del p
    if device == "cuda":
        torch.cuda.empty_cache()
    return report


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append", help="a named shape (repeatable)")
    ap.add_argument("--experts", type=int)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--inter", type=int, help="each expert's intermediate size on one GPU (after TP)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--full", action="store_true", help="the large search space (minutes per shape)")
    ap.add_argument("--budget-s", type=float, default=600.0, help="stop searching after this long (per shape)")
    ap.add_argument("--out-dir", help="where the JSON goes (default: the repo's shipped configs)")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args(argv)
    shapes = [SHAPES[s] for s in args.shape or []]
    if args.experts:
        shapes.append((args.experts, args.top_k, args.hidden, args.inter))
    if not shapes:
        ap.error("give --shape or --experts/--top-k/--hidden/--inter")
    dtype = getattr(torch, args.dtype)
    report = {}
    for e, k, h, inter in shapes:
        report[f"E={e},k={k},H={h},I={inter}"] = tune_shape(e, k, h, inter, args.batch_sizes, dtype, args.full,
                                                            args.budget_s, args.out_dir)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
