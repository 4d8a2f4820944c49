"""Per-op LoRA microbenchmark on one GPU (issue 13): where a mixed LoRA batch's time goes on a Llama-3-8B shape.

Two parts, both over 32 layers of the four projections (q/k/v fused, o, gate/up fused, down; every layer its own
weights, so the HBM traffic is a real step's), 8 slots of rank 16, bf16:

- ``decode``: one CUDA graph per (op, config, projection kind) runs that projection's LoRA delta for all 32
  layers at batch ``--decode-n`` (64: tokens spread over the 8 slots; ``zero``: every token base, what base
  requests on a LoRA engine pay); the graph's replay time is what the op adds to a replayed decode step. Ops:
  the dense torch op and the fixed-grid Triton SGMV op (octavo.lora.static) under each SGMV launch config of
  ``CONFIGS`` (octavo.plugins.platforms.cuda_lora.CONFIG); next to them the base linears of the same step (``x @ W^T``).
- ``prefill``: an eager step of ``--prefill-n`` tokens (16 requests of 128, adapter i % 8, as the engine
  benchmark's chunks): the torch layouts (octavo.lora.ops, what ``auto`` ran in session 4) vs the Triton SGMV
  kernels, per projection kind, and the base linears.

    python benchmarks/lora_ops_bench.py --out DIR [--budget-s 25]

Prints one line per measurement and writes ``lora_ops.json`` (ms per step for 32 layers) with ``best``: the
SGMV config with the lowest decode total. Without CUDA it runs each op once at tiny widths (a dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

T0 = time.perf_counter()
KINDS = {"qkv": (4096, [4096, 1024, 1024]), "o": (4096, [4096]), "gate_up": (4096, [14336, 14336]),
         "down": (14336, [4096])}
TINY = {"qkv": (64, [64, 16, 16]), "o": (64, [64]), "gate_up": (64, [128, 128]), "down": (128, [64])}
# SGMV launch configs tried (keys of octavo.plugins.platforms.cuda_lora.CONFIG; k_per_split is a runtime argument, so its
# variants compile nothing new)
CONFIGS = {  # in order of promise: the budget may cut the tail (each new tile shape compiles)
    "s4": {"k_per_split": 0, "part_expand": 0, "static_h": 0},  # session 4: split = min(8, K // 512)
    "k128": {"k_per_split": 128, "part_expand": 0, "static_h": 0},  # session 5 batch 1's pick
    "default": {},  # octavo.plugins.platforms.cuda_lora.DEFAULT_CONFIG (session 5: k128 + part_expand + static_h)
    "k128_parts": {"k_per_split": 128, "part_expand": 1, "static_h": 0},
    "k128_n128_parts_sh": {"k_per_split": 128, "block_n": 128, "part_expand": 1, "static_h": 1},
    "k128_n32_parts_sh": {"k_per_split": 128, "block_n": 32, "part_expand": 1, "static_h": 1},
}



def _kernels():
    """The platform's LoRA kernels (plugins/platforms/cuda_lora.py), as the worker passes them to the manager."""
    from octavo.plugins.platforms.cuda import CudaPlatform

    return CudaPlatform().make_lora_kernels()

def log(msg: str) -> None:
    print(f"[lora_ops {time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def build(kinds: dict, layers: int, slots: int, rank: int, dtype, dev, base: bool):
    """Per kind, per layer: (W or None, A [S, parts*r, in], lora_b view [S, out, R], b_flat [out, S*R])."""
    out = {}
    for kind, (k, parts) in kinds.items():
        r = rank * len(parts)
        rows = []
        for _ in range(layers):
            w = torch.empty(sum(parts), k, device=dev, dtype=dtype).normal_(0, 0.02) if base else None
            a = torch.empty(slots, r, k, device=dev, dtype=dtype).normal_(0, 0.02)
            b_flat = torch.empty(sum(parts), slots * r, device=dev, dtype=dtype).normal_(0, 0.02)
            b_flat.mul_(block_diagonal(parts, slots, rank, dev, dtype))  # as the manager writes fused parts
            rows.append((w, a, b_flat.view(sum(parts), slots, r).permute(1, 0, 2), b_flat))
        out[kind] = rows
    return out


def block_diagonal(parts: list[int], slots: int, rank: int, dev, dtype) -> torch.Tensor:
    """``[out, slots * parts * rank]`` 0/1: part ``p``'s rows keep only rank columns ``p`` of every slot (batch 1 of
    session 5 timed random full B: ``part_expand`` then differs from the dense op by the off-diagonal blocks)."""
    out, r = sum(parts), rank * len(parts)
    mask = torch.zeros(out, r, device=dev, dtype=dtype)
    start = 0
    for p, size in enumerate(parts):
        mask[start:start + size, p * rank:(p + 1) * rank] = 1
        start += size
    return mask.repeat(1, slots)


def graph_ms(fn, iters: int, cuda: bool) -> float | None:
    """Replay time of ``fn`` captured in a CUDA graph (ms); None on CPU (ran once)."""
    fn()
    if not cuda:
        return None
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def eager_ms(fn, iters: int, cuda: bool) -> float | None:
    fn()
    if not cuda:
        return None
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def r4(v):
    return None if v is None else round(v, 4)


def decode(weights, args, dtype, dev, cuda, res) -> None:
    from octavo.lora.static import StaticLoRA

    n, slots = args.decode_n, args.slots
    xs = {kind: torch.randn(n, k, device=dev, dtype=dtype) for kind, (k, _) in args.kinds.items()}
    ys = {kind: torch.zeros(n, sum(p), device=dev, dtype=dtype) for kind, (_, p) in args.kinds.items()}
    mix = torch.arange(n) % slots
    d = res["decode"]
    d["base_linears"] = {}
    for kind, rows in weights.items():
        if rows[0][0] is not None:
            d["base_linears"][kind] = r4(graph_ms(lambda kind=kind, rows=rows: [
                torch.mm(xs[kind], w.t(), out=ys[kind]) for w, *_ in rows], args.iters, cuda))
    log(f"decode n={n}: base linears {d['base_linears']}")
    sgmv = cuda or os.environ.get("TRITON_INTERPRET") == "1"  # (interpreted on CPU: a dry run of the code path)
    ops = [("dense", None)] + ([(f"sgmv_{name}", cfg) for name, cfg in CONFIGS.items()] if sgmv else [])
    for op, cfg in ops:
        if time.perf_counter() - T0 > args.budget_s:
            log("budget spent: stopping decode")
            break
        if cfg is not None:
            triton_ops = _kernels()
            triton_ops.CONFIG.clear()
            triton_ops.CONFIG.update(triton_ops.DEFAULT_CONFIG)
            triton_ops.set_config(**cfg)
        entry = {}
        try:  # one config failing (a compile error, a bad result) must not cost the others
            static = StaticLoRA(slots, n, dtype, dev, _kernels() if cfg is not None else None)
            static.reserve_h(len(weights) * len(next(iter(weights.values()))), 64)  # (static_h configs only)
            keys = {kind: i * len(rows) for i, (kind, rows) in enumerate(weights.items())}  # + layer
            entry = {}
            for label, ts in (("mixed", mix), ("zero", None)):
                if label == "zero" and op not in ("dense", "sgmv_s4", "sgmv_default"):
                    continue
                static.write(ts, n)
                per = {kind: r4(graph_ms(lambda kind=kind, rows=rows, static=static, k0=keys[kind]: [
                    static.apply(xs[kind], ys[kind], a, b, f, args.parts[kind], k0 + i)
                    for i, (_, a, b, f) in enumerate(rows)], args.iters, cuda))
                    for kind, rows in weights.items()}
                per["total"] = r4(sum(v for v in per.values() if v is not None)) if cuda else None
                entry[label] = per
            if cfg is not None and cuda:  # correctness at these widths: the SGMV result vs the dense op (fp32 math), layer 0
                dense = StaticLoRA(slots, n, torch.float32, dev)
                static.write(mix, n)
                dense.write(mix, n)
                err = {}
                for kind, rows in weights.items():
                    _, a, b, f = rows[0]
                    got = static.apply(xs[kind], torch.zeros_like(ys[kind]), a, b, f, args.parts[kind],
                                       keys[kind]).float()
                    want = dense.apply(xs[kind].float(), torch.zeros_like(ys[kind]).float(), a.float(), b.float(),
                                       f.float())
                    err[kind] = round(((got - want).abs().max() / want.abs().max().clamp(min=1e-6)).item(), 5)
                entry["rel_err_vs_dense"] = err
        except Exception as e:  # noqa: BLE001 - recorded
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        d[op] = entry
        log(f"decode n={n} {op}: {entry}")
    if cuda:
        sg = {k: v["mixed"]["total"] for k, v in d.items() if k.startswith("sgmv_") and "mixed" in v
              and "error" not in v and max(v.get("rel_err_vs_dense", {}).values(), default=1) < 0.05}
        if sg:
            best = min(sg, key=sg.get)
            res["best"] = {"name": best[5:], "config": CONFIGS[best[5:]], "decode_total_ms": sg[best]}
            log(f"best SGMV config: {res['best']}")


def prefill(weights, args, dtype, dev, cuda, res) -> None:
    from octavo.lora import ops

    n, per_req = args.prefill_n, 128
    slots = torch.arange(n) // per_req % args.slots  # request i (128 tokens) on adapter i % S
    xs = {kind: torch.randn(n, k, device=dev, dtype=dtype) for kind, (k, _) in args.kinds.items()}
    ys = {kind: torch.zeros(n, sum(p), device=dev, dtype=dtype) for kind, (_, p) in args.kinds.items()}
    p = res["prefill"]
    p["base_linears"] = {}
    for kind, rows in weights.items():
        if rows[0][0] is not None:
            p["base_linears"][kind] = r4(eager_ms(lambda kind=kind, rows=rows: [
                torch.mm(xs[kind], w.t(), out=ys[kind]) for w, *_ in rows], 3, cuda))
    log(f"prefill n={n}: base linears {p['base_linears']}")
    variants = [("torch", False, None)]
    if cuda or os.environ.get("TRITON_INTERPRET") == "1":
        variants += [("sgmv_s4", True, CONFIGS["s4"]), ("sgmv_best", True, res.get("best", {}).get("config", {}))]
    for name, use_triton, cfg in variants:
        if time.perf_counter() - T0 > args.budget_s + 5:
            log("budget spent: stopping prefill")
            break
        if cfg is not None:
            triton_ops = _kernels()
            triton_ops.CONFIG.clear()
            triton_ops.CONFIG.update(triton_ops.DEFAULT_CONFIG)
            triton_ops.set_config(**cfg)

        def step(kind, rows, use_triton=use_triton):
            plan = ops.plan_tokens(slots, dev, _kernels() if use_triton else None)  # once per step in the engine: counted per kind here
            for _, a, b, _f in rows:
                ops.lora_shrink_expand(xs[kind], ys[kind], a, b, plan, args.parts[kind])

        try:
            per = {kind: r4(eager_ms(lambda kind=kind, rows=rows: step(kind, rows), 3, cuda))
                   for kind, rows in weights.items()}
            per["total"] = r4(sum(v for v in per.values() if v is not None)) if cuda else None
            plan = ops.plan_tokens(slots, dev, _kernels() if use_triton else None)
            per["mode"] = plan.mode
            # GPU time alone (the engine's host runs ahead of big prefill GEMMs): the plan built once, the 32
            # layers' ops of a kind replayed in a CUDA graph
            gpu = {kind: r4(graph_ms(lambda kind=kind, rows=rows, plan=plan: [
                ops.lora_shrink_expand(xs[kind], ys[kind], a, b, plan, args.parts[kind]) for _, a, b, _f in rows],
                5, cuda)) for kind, rows in weights.items()}
            gpu["total"] = r4(sum(v for v in gpu.values() if v is not None)) if cuda else None
            per["gpu_only"] = gpu
        except Exception as e:  # noqa: BLE001 - recorded
            per = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        p[name] = per
        log(f"prefill n={n} {name}: {per}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--decode-n", type=int, default=64)
    ap.add_argument("--prefill-n", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-base", action="store_true", help="skip the base linears (14 GB of weights at 8B)")
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    args.kinds = KINDS if cuda else TINY
    args.parts = {kind: [sum(p[:i]) for i in range(len(p))] for kind, (_, p) in args.kinds.items()}
    layers = args.layers if cuda else 2
    if not cuda:
        args.prefill_n = 256
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "layers": layers, "slots": args.slots,
           "rank": args.rank, "decode_n": args.decode_n, "prefill_n": args.prefill_n, "decode": {}, "prefill": {}}
    weights = build(args.kinds, layers, args.slots, args.rank, dtype, dev, not args.no_base)
    log(f"weights built ({layers} layers)")
    try:
        decode(weights, args, dtype, dev, cuda, res)
        prefill(weights, args, dtype, dev, cuda, res)
    finally:
        print(json.dumps(res), flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "lora_ops.json"), "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
