"""Decode attention at large batch on one GPU: where the fp8 8B throughput step goes (issue 9), kernel level.

A Llama-3-8B attention layer (32 query heads, 8 KV heads, head 128, block 16) decoding ``--batch`` requests
whose contexts are uniform in [``--ctx-lo``, ``--ctx-hi``] (the 512 x 1000/1000 run's range), blocks
shuffled like a warm cache. Times one layer's attention call (no KV write) for

- the general kernel (``_triton_kernels._paged_attention_kernel``, what the ``triton`` backend runs today) at
  its launch config and a few others (BLOCK_N, warps, stages, split-KV at big batch), and
- the decode kernel (``_triton_decode``): KV heads of a request adjacent in the grid or not, fp16 or bf16 dots,

on an fp8 (e4m3) and a bf16 cache; each result names its KV bytes per second (the bound of a decode step at
this batch) and its largest difference from a float32 reference on the first 16 requests. Then the linear layers of one 8B
layer at the same rows: bf16 ``F.linear`` vs fp8 ``_scaled_mm`` (input prequantized, as the norm kernel
gives it; also with ``use_fast_accum=True``, Hopper's fp8 accumulation without fp32 promotion, time and error
vs float64) and the separate per-token quantization kernel. Bounded: each variant checks ``--budget``; the
JSON is rewritten after each.

    python benchmarks/fp8_attn_bench.py --out /tmp/attn.json --budget 30
    python benchmarks/fp8_attn_bench.py --set linears --rows 256,512,8192 --out /tmp/mm.json --budget 10
    TRITON_INTERPRET=1 python benchmarks/fp8_attn_bench.py --out /tmp/attn.json --dry   # CPU: tiny shapes

In the CPU interpreter only the fp16-dot variants compute right (its bf16 dots of fp8-converted tiles give
garbage), so a dry run checks the plumbing; the numbers come from the GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.perf_counter()
HEADS, KV_HEADS, HEAD, PAGE = 32, 8, 128, 16


def build(batch, lo, hi, cache_dtype, dev, seed=0):
    """q [B, 32, 128] bf16, a KV cache holding every request's context (shuffled blocks), block tables."""
    gen = torch.Generator().manual_seed(seed)
    ctx = torch.randint(lo, hi + 1, (batch,), generator=gen)
    ctx[0] = hi  # the block-table width (a kernel specialization) then depends only on ``hi``
    nblk = (ctx + PAGE - 1) // PAGE
    total = int(nblk.sum()) + 1
    perm = torch.randperm(total - 1, generator=gen) + 1  # block 0 stays the null block
    width = int(nblk.max())
    tables = torch.zeros(batch, width, dtype=torch.int32)
    at = 0
    for i, n in enumerate(nblk.tolist()):
        tables[i, :n] = perm[at: at + n].to(torch.int32)
        at += n
    dt = torch.bfloat16 if cache_dtype == "bf16" else torch.float8_e4m3fn
    kv = torch.empty(2, total, PAGE, KV_HEADS, HEAD, dtype=torch.bfloat16, device=dev)
    kv.normal_(generator=torch.Generator(device=dev).manual_seed(seed))
    kv = kv.to(dt)  # scale 1.0: N(0, 1) values sit well inside e4m3's range
    q = torch.randn(batch, HEADS, HEAD, generator=gen).to(torch.bfloat16).to(dev)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    return q, kv, tables.to(dev), ctx.to(torch.int32).to(dev), qsl, int(ctx.sum())


def reference(q, kv, tables, seq_lens, n):
    """float32 attention of the first ``n`` requests, straight from the cache (scale 1.0)."""
    outs = []
    for i in range(n):
        L = int(seq_lens[i])
        blocks = tables[i, : (L + PAGE - 1) // PAGE].long()
        k, v = (kv[j][blocks].float().reshape(-1, KV_HEADS, HEAD)[:L] for j in (0, 1))
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        s = torch.einsum("hd,lhd->hl", q[i].float(), k) * HEAD ** -0.5
        outs.append(torch.einsum("hl,lhd->hd", s.softmax(-1), v))
    return torch.stack(outs)


def general(q, kv, tables, seq_lens, qsl, out, block_n=64, warps=4, stages=2, splits=1):
    """The triton backend's decode launch (group 4 -> BLOCK_Q 1, BLOCK_M 16); ``splits`` > 1 adds split-KV
    partials + the merge kernel, as the backend does for few requests."""
    from octavo.plugins.attention._triton_kernels import LOG2E, _merge_splits_kernel, _paged_attention_kernel

    scale = HEAD ** -0.5
    dst, lse = out, out
    strides = (out.stride(0), out.stride(1), 0, 0, 0)
    if splits > 1:
        dst = torch.empty(q.shape[0], HEADS, splits, HEAD, dtype=torch.float32, device=q.device)
        lse = torch.empty(q.shape[0], HEADS, splits, dtype=torch.float32, device=q.device)
        strides = (dst.stride(0), dst.stride(1), dst.stride(2), lse.stride(0), lse.stride(1))
    _paged_attention_kernel[(q.shape[0], splits, KV_HEADS)](
        q, kv[0], kv[1], dst, lse, tables, seq_lens, qsl,
        scale * LOG2E, scale, 1.0, 0, 1.0,
        q.stride(0), q.stride(1), *strides,
        kv.stride(1), kv.stride(2), tables.stride(0),
        GROUP=4, GROUP_P=4, BLOCK_Q=1, BLOCK_M=16, BLOCK_N=block_n, HEAD_D=HEAD, HEAD_DP=HEAD, PAGE=PAGE,
        NUM_SPLITS=splits, USE_SOFTCAP=False, USE_WINDOW=False, DOT_PREC="tf32",
        KV_FP8=kv.dtype == torch.float8_e4m3fn, num_warps=warps, num_stages=stages)
    if splits > 1:
        _merge_splits_kernel[(q.shape[0], HEADS)](dst, lse, out, HEADS, out.stride(0), out.stride(1),
                                                  NUM_SPLITS=splits, HEAD_D=HEAD, HEAD_DP=HEAD)


def decode(q, kv, tables, seq_lens, qsl, out, **kw):
    from octavo.plugins.attention._triton_decode import paged_decode

    paged_decode(q, kv[0], kv[1], out, tables, seq_lens, qsl, num_reqs=q.shape[0], num_kv_heads=KV_HEADS,
                 scale=HEAD ** -0.5, v_scale=1.0, block_size=PAGE, **kw)


# (cache, name, kernel, launch args) in priority order: the budget cuts the tail (the config sweeps)
VARIANTS = [
    ("fp8", "general_n64_w4_s2 (today)", "general", {}),
    ("fp8", "decode_heads_f16_n64_w4_s2", "decode", {}),
    ("bf16", "general_n64_w4_s2 (today)", "general", {}),
    ("bf16", "decode_heads_n64_w4_s2", "decode", {}),
    ("fp8", "decode_heads_f16_n64_w2_s2", "decode", dict(num_warps=2)),
    ("fp8", "decode_heads_f16_n32_w2_s3", "decode", dict(block_n=32, num_warps=2, num_stages=3)),
    ("fp8", "decode_reqs_f16_n64_w4_s2", "decode", dict(heads_fastest=False)),
    ("fp8", "decode_heads_f16_n64_w4_s2_maxnreg128", "decode", dict(maxnreg=128)),
    ("fp8", "decode_heads_f16_n32_w4_s3", "decode", dict(block_n=32, num_stages=3)),
    ("fp8", "decode_heads_f16_n16_w4_s4", "decode", dict(block_n=16, num_stages=4)),
    ("fp8", "general_n64_w4_s2_split2", "general", dict(splits=2)),
    ("fp8", "decode_heads_bf16_n64_w4_s2", "decode", dict(dot_f16=False)),
    ("fp8", "decode_heads_f16_n64_w4_s2_maxnreg96", "decode", dict(maxnreg=96)),
    ("fp8", "decode_heads_f16_n128_w4_s2", "decode", dict(block_n=128)),
    ("fp8", "decode_heads_f16_n64_w4_s3", "decode", dict(num_stages=3)),
    ("fp8", "decode_heads_f16_n32_w4_s2", "decode", dict(block_n=32)),
    ("fp8", "general_n64_w8_s2", "general", dict(warps=8)),
    ("fp8", "general_n128_w4_s2", "general", dict(block_n=128)),
    ("fp8", "decode_heads_f16_n128_w8_s2", "decode", dict(block_n=128, num_warps=8)),
    ("fp8", "general_n64_w4_s2_split4", "general", dict(splits=4)),
    ("bf16", "decode_heads_n64_w2_s2", "decode", dict(num_warps=2)),
    ("bf16", "decode_reqs_n64_w4_s2", "decode", dict(heads_fastest=False)),
    ("bf16", "decode_heads_n32_w4_s3", "decode", dict(block_n=32, num_stages=3)),
    ("bf16", "decode_heads_n128_w4_s2", "decode", dict(block_n=128)),
]

# session 5: several adjacent KV heads per program (``pack``: 256 / 512 contiguous bytes per key, one softmax
# for 2-4 groups), at ~200 running sequences; ``--set s5``
VARIANTS_S5 = [
    ("fp8", "decode_default (pack 1, 4 warps, 64 keys, maxnreg 128)", "decode", {}),
    ("fp8", "decode_pack2_w4", "decode", dict(pack=2)),
    ("fp8", "decode_pack2_w8", "decode", dict(pack=2, num_warps=8)),
    ("fp8", "decode_pack4_w8", "decode", dict(pack=4, num_warps=8)),
    ("bf16", "decode_default", "decode", {}),
    ("bf16", "decode_pack2_w4", "decode", dict(pack=2)),
    ("fp8", "decode_pack2_w4_n32_s3", "decode", dict(pack=2, block_n=32, num_stages=3)),
    ("fp8", "decode_pack4_w4_n32", "decode", dict(pack=4, block_n=32)),
    ("fp8", "decode_pack2_w4_maxnreg168", "decode", dict(pack=2, maxnreg=168)),
    ("fp8", "decode_pack2_w8_n128", "decode", dict(pack=2, num_warps=8, block_n=128)),
    ("fp8", "decode_pack4_w8_s3", "decode", dict(pack=4, num_warps=8, num_stages=3)),
    ("fp8", "decode_pack1_n128_maxnreg128", "decode", dict(block_n=128, maxnreg=128)),
    ("fp8", "decode_pack1_s3_maxnreg128", "decode", dict(num_stages=3, maxnreg=128)),
    ("bf16", "decode_pack2_w8", "decode", dict(pack=2, num_warps=8)),
    ("bf16", "decode_pack4_w8", "decode", dict(pack=4, num_warps=8)),
]

VARIANTS_S5_BIG = [v for v in VARIANTS_S5 if v[1] in (
    "decode_default (pack 1, 4 warps, 64 keys, maxnreg 128)", "decode_pack2_w4", "decode_pack2_w8", "decode_pack4_w8",
    "decode_default", "decode_pack2_w4_n32_s3")]  # ``--set s5big``: the main ones again at 512 requests


def _warm(args_ctx, chunk, dev="cuda"):
    """Process-pool worker: compile ``chunk``'s variants into Triton's on-disk cache on a small batch with the
    same specializations (batch a multiple of 16, the same context range -> the same block-table width class)."""
    kernels = {"general": general, "decode": decode}
    done = 0
    with torch.inference_mode():
        for cache in ("fp8", "bf16"):
            mine = [v for v in chunk if v[0] == cache]
            if not mine:
                continue
            q, kv, tables, seq_lens, qsl, _ = build(16, *args_ctx, cache, dev)
            for _, _, kernel, kw in mine:
                try:
                    kernels[kernel](q, kv, tables, seq_lens, qsl, torch.empty_like(q), **kw)
                    done += 1
                except Exception:  # noqa: BLE001 - the timed run records the error
                    pass
    if dev == "cuda":
        torch.cuda.synchronize()
    return done


def prewarm(args, variants, res, dev="cuda") -> None:
    """Compile the variants in parallel processes first (Triton compiles on the host, one at a time per process:
    ~1 s each would eat the budget); the timed loop then loads them from the cache."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t = time.perf_counter()
    workers = min(8, len(variants))
    chunks = [variants[i::workers] for i in range(workers)]
    pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        futs = [pool.submit(_warm, (args.ctx_lo, args.ctx_hi), c, dev) for c in chunks]
        deadline = t + max(5.0, args.budget * 0.6)
        done = sum(f.result(timeout=max(0.1, deadline - time.perf_counter())) for f in futs)
        res["prewarm"] = {"compiled": done, "of": len(variants), "s": time.perf_counter() - t}
    except Exception as e:  # noqa: BLE001 - compile in the timed loop instead
        res["prewarm"] = {"error": f"{type(e).__name__}: {e}"[:300], "s": time.perf_counter() - t}
    pool.shutdown(wait=False, cancel_futures=True)
    print("prewarm", res["prewarm"], flush=True)


def bench(fn, dry):
    if dry:
        fn()
        return float("nan")
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def attention(args, res, save, dev, variants):
    kernels = {"general": general, "decode": decode}
    for cache in ("fp8", "bf16"):
        if not any(v[0] == cache for v in variants):
            continue
        q, kv, tables, seq_lens, qsl, tokens = build(args.batch, args.ctx_lo, args.ctx_hi, cache, dev)
        kv_bytes = tokens * KV_HEADS * HEAD * 2 * kv.element_size()
        n_ref = min(16, args.batch)
        ref = reference(q, kv, tables, seq_lens, n_ref)
        part = res.setdefault(f"attention_{cache}", {"batch": args.batch, "context_tokens": tokens,
                                                     "kv_bytes_per_layer": kv_bytes})
        for _, name, kernel, kw in (v for v in variants if v[0] == cache):
            if time.perf_counter() - T0 > args.budget:
                part["skipped_for_budget"] = part.get("skipped_for_budget", []) + [name]
                continue
            out = torch.empty_like(q)
            fn = kernels[kernel]
            try:
                fn(q, kv, tables, seq_lens, qsl, out, **kw)
                ms = bench(functools.partial(fn, q, kv, tables, seq_lens, qsl, out, **kw), args.dry)
                row = {"ms": ms, "kv_TBps": kv_bytes / (ms * 1e-3) / 1e12,
                       "max_abs_diff_vs_fp32_ref": float((out[:n_ref].float() - ref).abs().max())}
            except Exception as e:  # noqa: BLE001 - record and go on: one config failing says something too
                row = {"error": f"{type(e).__name__}: {e}"[:400]}
            part[name] = row
            print(cache, name, row, flush=True)
            save()
        del q, kv, tables
        if dev == "cuda":
            torch.cuda.empty_cache()


def linears(args, res, save, dev, rows_list):
    """One 8B layer's four projections at ``rows`` rows: bf16 vs fp8 (prequantized input) vs the quantize."""
    if dev != "cuda":
        return
    from octavo.plugins.quant import fp8_triton
    from octavo.plugins.quant.fp8 import quantize_fp8_rows

    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
    for rows in rows_list:
        part = res.setdefault(f"linears_rows_{rows}", {})
        for name, (n, k) in shapes.items():
            if time.perf_counter() - T0 > args.budget:
                part["skipped_for_budget"] = True
                break
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
            wq, ws = quantize_fp8_rows(w)
            ws = ws.reshape(1, -1).contiguous()
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            xq, xs = fp8_triton.quantize_per_token(x)
            flop = 2 * rows * n * k
            t_bf16 = bench(functools.partial(torch.nn.functional.linear, x, w), False)
            mm = functools.partial(torch._scaled_mm, xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
            t_fp8 = bench(mm, False)
            t_q = bench(functools.partial(fp8_triton.quantize_per_token, x), False)
            part[name] = {"bf16_ms": t_bf16, "bf16_TFLOPs": flop / t_bf16 / 1e9, "fp8_ms": t_fp8,
                          "fp8_TFLOPs": flop / t_fp8 / 1e9, "quantize_ms": t_q}
            try:  # Hopper's fast fp8 accumulation (no periodic promotion to fp32): time and error vs float64
                t_fast = bench(functools.partial(mm, use_fast_accum=True), False)
                n_ref = min(rows, 64)
                ref = (xq[:n_ref].double() * xs[:n_ref].double()) @ (wq.double() * ws.reshape(-1, 1).double()).t()
                scale = float(ref.abs().max())
                part[name].update(fp8_fast_accum_ms=t_fast, fp8_fast_accum_TFLOPs=flop / t_fast / 1e9,
                                  rel_err_fp8=float((mm()[:n_ref].double() - ref).abs().max()) / scale,
                                  rel_err_fp8_fast_accum=float((mm(use_fast_accum=True)[:n_ref].double() - ref)
                                                               .abs().max()) / scale)
            except Exception as e:  # noqa: BLE001 - record why
                part[name]["fast_accum_error"] = f"{type(e).__name__}: {e}"[:300]
            print(rows, name, part[name], flush=True)
            save()
            del w, wq, x, xq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--ctx-lo", type=int, default=1000)
    ap.add_argument("--ctx-hi", type=int, default=2000)
    ap.add_argument("--dry", action="store_true", help="CPU interpreter: tiny shapes, no timing")
    ap.add_argument("--no-prewarm", action="store_true", help="compile each variant in the timed loop")
    ap.add_argument("--set", choices=("s4", "s5", "s5big", "linears"), default="s4",
                    help="s5: the pack variants, no linears; linears: only the linears at --rows")
    ap.add_argument("--rows", default="256,512,8192", help="--set linears: comma-separated row counts")
    ap.add_argument("--compile-only", action="store_true", help="only fill Triton's cache (run beside other work)")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dry:
        args.batch, args.ctx_lo, args.ctx_hi = 3, 5, 40
    res = {"card": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
           "torch": torch.__version__, "args": vars(args)}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    if args.compile_only:
        args.budget = args.budget / 0.6  # prewarm's deadline is 0.6 of the budget
        prewarm(args, VARIANTS if args.set == "s4" else VARIANTS_S5, res)
        return
    if args.set == "linears":
        with torch.inference_mode():
            linears(args, res, save, dev, [int(r) for r in args.rows.split(",")])
        res["seconds"] = time.perf_counter() - T0
        save()
        return
    if args.set != "s4":
        chosen = VARIANTS_S5 if args.set == "s5" else VARIANTS_S5_BIG
        if dev == "cuda" and not args.no_prewarm:
            prewarm(args, chosen, res)
        with torch.inference_mode():
            attention(args, res, save, dev, chosen)
        res["seconds"] = time.perf_counter() - T0
        save()
        print(f"done in {res['seconds']:.1f} s", flush=True)
        return
    if dev == "cuda" and not args.no_prewarm:
        prewarm(args, VARIANTS, res)
    with torch.inference_mode():  # the first 4 attention variants, the linears at the batch, then the rest
        attention(args, res, save, dev, VARIANTS[:4])
        linears(args, res, save, dev, [args.batch])
        attention(args, res, save, dev, VARIANTS[4:])
        linears(args, res, save, dev, [8192])
    res["seconds"] = time.perf_counter() - T0
    save()
    print(f"done in {res['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
